/* pb.c - one harness, four registration caches (one per binary, chosen at
 * compile time): -DBE_UCX (UCX 1.13.1 ucs_rcache), -DBE_GRDMA (Open MPI 4.1.4
 * rcache/grdma), -DBE_LF (libfabric 1.17.0 ofi_mr_cache), -DBE_MRC (mrcache's C
 * API, libmrcache.so).  Same workloads, same address sequences, same registrar
 * code for all.  Each result line:  <workload> ns=<wall/op> cpu=<process cpu/op> ...
 *
 *   pb hit N ITERS [seq]      N adjacent 8 KiB regions (untouched, 1 MiB aligned),
 *                             warmed by N misses, then ITERS get+put (random/in order)
 *   pb fill N                 N cold misses into an empty cache
 *   pb evict N MAX ITERS      limit MAX entries, regions cycled in order over N
 *   pb mt SECS                2-thread workload (see README/RESULTS): thread A misses on
 *                             a pool of 256 KiB buffers, thread B hits a hot set;
 *                             phases: B alone, A alone, A+B
 *   pb mt-noevict SECS        the same, but A misses on fresh 8 KiB regions with no limit:
 *                             misses without evictions (REG=spin or count: nothing pinned)
 *   pb regcost N              the registrar alone: N reg+dereg of 256 KiB
 * env: REG=count|uring|spin (default count), SPIN_NS (default 30000),
 *      POOL (A's buffers, 64), HOT (B's buffers, 8), MAXR (cache limit in mt, 32)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>
#include <linux/io_uring.h>

#define KIB 1024ul
#define REGION (8 * KIB)
#define SEED 0x9E3779B97F4A7C15ull

/* ------------------------------------------------------------------ registrar */
enum { REG_COUNT, REG_URING, REG_SPIN };
static int reg_mode = REG_COUNT;
static long spin_ns = 30000;
static atomic_ulong n_reg, n_dereg;
static atomic_long n_live;
static long reg_limit = 0; /* grdma only: OUT_OF_RESOURCE past this many live registrations */
static int ring_fd = -1;
#define SLOTS 16384
static uint32_t free_slots[SLOTS];
static int n_free;
static pthread_mutex_t slot_lock = PTHREAD_MUTEX_INITIALIZER;

static inline double wall_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}
static inline double cpu_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}
static void spin_for(long ns)
{
    double end = wall_ns() + ns;
    while (wall_ns() < end) __builtin_ia32_pause();
}

static void uring_init(void)
{
    struct io_uring_params p;
    memset(&p, 0, sizeof(p));
    ring_fd = syscall(__NR_io_uring_setup, 8, &p);
    if (ring_fd < 0) { perror("io_uring_setup"); exit(2); }
    struct io_uring_rsrc_register r;
    memset(&r, 0, sizeof(r));
    r.nr = SLOTS;
    r.flags = IORING_RSRC_REGISTER_SPARSE;
    if (syscall(__NR_io_uring_register, ring_fd, IORING_REGISTER_BUFFERS2, &r, sizeof(r)) < 0) {
        perror("IORING_REGISTER_BUFFERS2"); exit(2);
    }
    for (int i = 0; i < SLOTS; i++) free_slots[n_free++] = SLOTS - 1 - i;
}
static int uring_update(uint32_t slot, void *addr, size_t len)
{
    struct iovec iov = { addr, len };
    struct io_uring_rsrc_update2 u;
    memset(&u, 0, sizeof(u));
    u.offset = slot;
    u.data = (uint64_t)(uintptr_t)&iov;
    u.nr = 1;
    int r = syscall(__NR_io_uring_register, ring_fd, IORING_REGISTER_BUFFERS_UPDATE, &u, sizeof(u));
    return r < 0 ? -errno : 0;
}

static void registrar_init(void)
{
    const char *m = getenv("REG");
    if (getenv("SPIN_NS")) spin_ns = atol(getenv("SPIN_NS"));
    if (!m || !strcmp(m, "count")) reg_mode = REG_COUNT;
    else if (!strcmp(m, "uring")) { reg_mode = REG_URING; uring_init(); }
    else if (!strcmp(m, "spin")) reg_mode = REG_SPIN;
    else { fprintf(stderr, "REG=%s?\n", m); exit(2); }
}
static const char *reg_name(void) { return reg_mode == REG_COUNT ? "count" : reg_mode == REG_URING ? "uring" : "spin"; }

static void registrar_on_reg(void);
/* returns 0 and a handle, or -ENOSPC (grdma limit emulation), or -errno */
static int registrar_reg(void *addr, size_t len, uint64_t *handle)
{
    if (reg_limit && atomic_load_explicit(&n_live, memory_order_relaxed) >= reg_limit) return -ENOSPC;
    uint64_t h = atomic_fetch_add_explicit(&n_reg, 1, memory_order_relaxed) + 1;
    registrar_on_reg();
    if (reg_mode == REG_URING) {
        pthread_mutex_lock(&slot_lock);
        if (!n_free) { pthread_mutex_unlock(&slot_lock); return -ENOSPC; }
        uint32_t s = free_slots[--n_free];
        pthread_mutex_unlock(&slot_lock);
        int r = uring_update(s, addr, len);
        if (r) { fprintf(stderr, "uring reg %p+%zu: %s\n", addr, len, strerror(-r)); exit(2); }
        h = s;
    } else if (reg_mode == REG_SPIN) {
        spin_for(spin_ns);
    }
    atomic_fetch_add_explicit(&n_live, 1, memory_order_relaxed);
    *handle = h;
    return 0;
}
static void registrar_on_dereg(void);
static void registrar_dereg(uint64_t handle)
{
    atomic_fetch_add_explicit(&n_dereg, 1, memory_order_relaxed);
    registrar_on_dereg();
    atomic_fetch_sub_explicit(&n_live, 1, memory_order_relaxed);
    if (reg_mode == REG_URING) {
        int r = uring_update((uint32_t)handle, NULL, 0);
        if (r) { fprintf(stderr, "uring dereg: %s\n", strerror(-r)); exit(2); }
        pthread_mutex_lock(&slot_lock);
        free_slots[n_free++] = (uint32_t)handle;
        pthread_mutex_unlock(&slot_lock);
    } else if (reg_mode == REG_SPIN) {
        spin_for(spin_ns / 2);
    }
}

/* ------------------------------------------------------------------ backends */
/* be_init(max_entries or 0), be_get(addr,len) -> token, be_put(token), be_destroy() */
#if defined(BE_UCX)
#include <ucs/memory/rcache.h>
#include <ucs/type/status.h>
#include <ucm/api/ucm.h>
#define BE_NAME "ucx"
typedef struct { ucs_rcache_region_t super; uint64_t h; } be_region_t;
static ucs_rcache_t *rc;
static ucs_status_t u_reg(void *c, ucs_rcache_t *r, void *a, ucs_rcache_region_t *reg, uint16_t f)
{
    (void)c; (void)r; (void)a; (void)f;
    return registrar_reg((void *)reg->super.start, reg->super.end - reg->super.start, &((be_region_t *)reg)->h)
               ? UCS_ERR_NO_RESOURCE : UCS_OK;
}
static void u_dereg(void *c, ucs_rcache_t *r, ucs_rcache_region_t *reg) { (void)c; (void)r; registrar_dereg(((be_region_t *)reg)->h); }
static void u_dump(void *c, ucs_rcache_t *r, ucs_rcache_region_t *reg, char *b, size_t m) { (void)c; (void)r; snprintf(b, m, "h=%lu", (unsigned long)((be_region_t *)reg)->h); }
static const ucs_rcache_ops_t u_ops = { .mem_reg = u_reg, .mem_dereg = u_dereg, .dump_region = u_dump };
static void be_init(unsigned long max)
{
    ucs_rcache_params_t p;
    memset(&p, 0, sizeof(p));
    p.region_struct_size = sizeof(be_region_t);
    p.alignment = 4096;
    p.max_alignment = 4096;
    p.ucm_events = UCM_EVENT_VM_UNMAPPED;
    p.ucm_event_priority = 1000;
    p.ops = &u_ops;
    p.max_regions = max ? max : ULONG_MAX;
    p.max_size = SIZE_MAX;
    p.max_unreleased = SIZE_MAX;
    if (ucs_rcache_create(&p, "pb", NULL, &rc) != UCS_OK) { fprintf(stderr, "ucs_rcache_create\n"); exit(2); }
}
static inline void *be_get(void *a, size_t len)
{
    ucs_rcache_region_t *r;
    ucs_status_t st = ucs_rcache_get(rc, a, len, PROT_READ | PROT_WRITE, NULL, &r);
    if (st != UCS_OK) { fprintf(stderr, "ucs_rcache_get: %s\n", ucs_status_string(st)); exit(2); }
    return r;
}
static inline void be_put(void *t) { ucs_rcache_region_put(rc, t); }
static void be_destroy(void) { ucs_rcache_destroy(rc); }

#elif defined(BE_GRDMA)
#include "opal_config.h"
#include "opal/runtime/opal.h"
#include "opal/mca/base/base.h"
#include "opal/mca/rcache/rcache.h"
#include "opal/mca/rcache/base/base.h"
#include "opal/threads/thread_usage.h"
#define BE_NAME "grdma"
typedef struct { mca_rcache_base_registration_t super; uint64_t h; } be_region_t;
static mca_rcache_base_module_t *rc;
static int g_reg(void *d, void *base, size_t size, mca_rcache_base_registration_t *reg)
{
    (void)d;
    return registrar_reg(base, size, &((be_region_t *)reg)->h) ? OPAL_ERR_OUT_OF_RESOURCE : OPAL_SUCCESS;
}
static int g_dereg(void *d, mca_rcache_base_registration_t *reg) { (void)d; registrar_dereg(((be_region_t *)reg)->h); return OPAL_SUCCESS; }
#define G_RW (MCA_RCACHE_ACCESS_LOCAL_WRITE | MCA_RCACHE_ACCESS_REMOTE_READ | MCA_RCACHE_ACCESS_REMOTE_WRITE)
static void be_init(unsigned long max)
{
    int argc = 1; char *argv0[] = { "pb", NULL }; char **argv = argv0;
    if (opal_init(&argc, &argv) != OPAL_SUCCESS) { fprintf(stderr, "opal_init\n"); exit(2); }
    mca_base_framework_open(&opal_rcache_base_framework, 0);
    /* grdma's locks are no-ops unless threads are on (MPI_THREAD_MULTIPLE); GRDMA_THREADS=0 turns them off */
    opal_set_using_threads(!getenv("GRDMA_THREADS") || atoi(getenv("GRDMA_THREADS")));
    mca_rcache_base_resources_t res;
    memset(&res, 0, sizeof(res));
    res.cache_name = "pb";
    res.sizeof_reg = sizeof(be_region_t);
    res.register_mem = g_reg;
    res.deregister_mem = g_dereg;
    rc = mca_rcache_base_module_create("grdma", NULL, &res);
    if (!rc) { fprintf(stderr, "grdma create\n"); exit(2); }
    /* grdma has no entry limit: it evicts one LRU entry when the registrar says
     * OUT_OF_RESOURCE (what ibv_reg_mr's ENOMEM does), so the limit is the registrar's */
    reg_limit = max;
}
static inline void *be_get(void *a, size_t len)
{
    mca_rcache_base_registration_t *reg = NULL;
    int r = rc->rcache_register(rc, a, len, 0, G_RW, &reg);
    if (r != OPAL_SUCCESS) { fprintf(stderr, "grdma register: %d\n", r); exit(2); }
    return reg;
}
static inline void be_put(void *t) { rc->rcache_deregister(rc, t); }
static void be_destroy(void) { mca_rcache_base_module_destroy(rc); }

#elif defined(BE_LF)
#include "config.h"
#include <ofi_util.h>
#include <ofi_mr.h>
#define BE_NAME "libfabric"
struct be_data { uint64_t h; };
static struct ofi_mr_cache cache;
static struct util_domain dom;
static int l_add(struct ofi_mr_cache *c, struct ofi_mr_entry *e)
{
    (void)c;
    return registrar_reg(e->info.iov.iov_base, e->info.iov.iov_len, &((struct be_data *)e->data)->h) ? -FI_ENOMEM : 0;
}
static void l_del(struct ofi_mr_cache *c, struct ofi_mr_entry *e) { (void)c; registrar_dereg(((struct be_data *)e->data)->h); }
static void be_init(unsigned long max)
{
    struct ofi_mem_monitor *monitors[OFI_HMEM_MAX] = { NULL };
    ofi_monitors_init();
    cache_params.max_cnt = max ? max : (1ul << 40);
    cache_params.max_size = SIZE_MAX / 2;
    memset(&dom, 0, sizeof(dom));
    dom.prov = &core_prov;
    ofi_atomic_initialize32(&dom.ref, 0);
    memset(&cache, 0, sizeof(cache));
    cache.entry_data_size = sizeof(struct be_data);
    cache.add_region = l_add;
    cache.delete_region = l_del;
    monitors[FI_HMEM_SYSTEM] = default_monitor;
    if (ofi_mr_cache_init(&dom, monitors, &cache)) { fprintf(stderr, "ofi_mr_cache_init\n"); exit(2); }
}
static inline void *be_get(void *a, size_t len)
{
    struct ofi_mr_info info;
    struct ofi_mr_entry *e = NULL;
    memset(&info, 0, sizeof(info));
    info.iov.iov_base = a;
    info.iov.iov_len = len;
    info.iface = FI_HMEM_SYSTEM;
    int r = ofi_mr_cache_search(&cache, &info, &e);
    if (r) { fprintf(stderr, "ofi_mr_cache_search: %d\n", r); exit(2); }
    return e;
}
static inline void be_put(void *t) { ofi_mr_cache_delete(&cache, t); }
static void be_destroy(void) { ofi_mr_cache_cleanup(&cache); }

#elif defined(BE_MRC)
#include <mrcache.h>
#define BE_NAME "mrcache-C"
static mrcache_t *mc;
static int m_reg(void *ctx, void *addr, size_t len, uint32_t access, void **h, uint32_t *lkey, uint32_t *rkey)
{
    (void)ctx; (void)access;
    uint64_t hh;
    int r = registrar_reg(addr, len, &hh);
    if (r) return -r;
    *h = (void *)(uintptr_t)hh; *lkey = (uint32_t)hh; *rkey = (uint32_t)hh;
    return 0;
}
static int m_dereg(void *ctx, void *h) { (void)ctx; registrar_dereg((uint64_t)(uintptr_t)h); return 0; }
#define M_RW (MRCACHE_ACCESS_LOCAL_WRITE | MRCACHE_ACCESS_REMOTE_READ | MRCACHE_ACCESS_REMOTE_WRITE)
static void be_init(unsigned long max)
{
    mrcache_registrar_t r = { NULL, m_reg, m_dereg };
    mrcache_config_t cfg;
    mrcache_config_init(&cfg);
    cfg.max_regions = max;
    if (mrcache_create(&cfg, &r, &mc) != MRCACHE_OK) { fprintf(stderr, "mrcache_create: %s\n", mrcache_last_error(NULL)); exit(2); }
}
static inline void *be_get(void *a, size_t len)
{
    mrcache_lease_t l;
    if (mrcache_acquire(mc, a, len, M_RW, &l) != MRCACHE_OK) { fprintf(stderr, "mrcache_acquire: %s\n", mrcache_last_error(NULL)); exit(2); }
    return (void *)(uintptr_t)l.opaque;
}
static inline void be_put(void *t)
{
    mrcache_lease_t l = { (uint64_t)(uintptr_t)t };
    if (mrcache_release(mc, l) != MRCACHE_OK) { fprintf(stderr, "mrcache_release: %s\n", mrcache_last_error(NULL)); exit(2); }
}
static void be_destroy(void) { mrcache_destroy(mc); }
#else
#error "define one of BE_UCX BE_GRDMA BE_LF BE_MRC"
#endif

static inline void get_put(uintptr_t a, size_t len) { be_put(be_get((void *)a, len)); }

/* ------------------------------------------------------------------ helpers */
static uintptr_t reserve(size_t len, int touch)
{
    size_t align = 1ul << 20;
    void *p = mmap(NULL, len + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); exit(2); }
    uintptr_t a = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
    if (touch) memset((void *)a, 1, len);
    return a;
}
struct rng { uint64_t s; };
static inline uint32_t below(struct rng *g, uint32_t n)
{
    uint64_t x = g->s;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    g->s = x;
    return (uint32_t)((((x * 0x2545F4914F6CDD1Dull) >> 32) * n) >> 32);
}
struct mark { double w, c; };
static struct mark now(void) { return (struct mark){ wall_ns(), cpu_ns() }; }
static void report(const char *name, struct mark a, struct mark b, double ops, const char *extra)
{
    printf("%s ns=%.2f cpu=%.2f%s\n", name, (b.w - a.w) / ops, (b.c - a.c) / ops, extra ? extra : "");
}

/* resident bytes of the process (/proc/self/statm) */
static double rss_bytes(void)
{
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f || fscanf(f, "%ld %ld", &pages, &resident) != 2) { perror("/proc/self/statm"); exit(2); }
    fclose(f);
    return (double)resident * (double)sysconf(_SC_PAGESIZE);
}

/* ------------------------------------------------------------------ single-thread workloads */
static void w_hit(uint32_t n, long iters, int seq)
{
    be_init(0);
    uintptr_t base = reserve((size_t)n * REGION, 0);
    for (uint32_t i = 0; i < n; i++) get_put(base + (size_t)i * REGION, REGION);
    unsigned long r0 = n_reg;
    /* an untimed warm pass, the same sequence as the timed one: hits are measured in steady state */
    struct rng g = { SEED ^ 0x5A5A };
    uint32_t i = 0;
    for (long k = 0; k < iters / 2 + 2l * n; k++) {
        uint32_t j = seq ? i : below(&g, n);
        if (++i == n) i = 0;
        get_put(base + (size_t)j * REGION, REGION);
    }
    g.s = SEED;
    i = 0;
    struct mark t = now();
    for (long k = 0; k < iters; k++) {
        uint32_t j = seq ? i : below(&g, n);
        if (++i == n) i = 0;
        get_put(base + (size_t)j * REGION, REGION);
    }
    struct mark t1 = now();
    char name[64];
    snprintf(name, sizeof name, "hit%s/%u", seq ? "-seq" : "", n);
    report(name, t, t1, iters, NULL);
    if (n_reg != r0) { fprintf(stderr, "%s: %lu misses during hits\n", name, n_reg - r0); exit(2); }
}

static void w_fill(uint32_t n)
{
    be_init(0);
    uintptr_t base = reserve((size_t)n * REGION, 0);
    double rss0 = rss_bytes();
    struct mark t = now();
    for (uint32_t i = 0; i < n; i++) get_put(base + (size_t)i * REGION, REGION);
    struct mark t1 = now();
    char name[64], extra[64];
    snprintf(name, sizeof name, "fill/%u", n);
    /* the cache's own memory per entry: the regions are never touched, so RSS grows only by the cache */
    snprintf(extra, sizeof extra, " rss_per_entry=%.0f", (rss_bytes() - rss0) / n);
    report(name, t, t1, n, extra);
    if (n_reg != n) { fprintf(stderr, "fill: %lu regs\n", (unsigned long)n_reg); exit(2); }
}

static void w_evict(uint32_t n, unsigned long max, long iters)
{
    be_init(max);
    uintptr_t base = reserve((size_t)n * REGION, 0);
    long k;
    for (k = 0; k < (long)max; k++) get_put(base + (size_t)(k % n) * REGION, REGION);
    unsigned long r0 = n_reg;
    struct mark t = now();
    for (; k < (long)max + iters; k++) get_put(base + (size_t)(k % n) * REGION, REGION);
    struct mark t1 = now();
    char name[64], extra[96];
    snprintf(name, sizeof name, "evict/%u/%lu", n, max);
    snprintf(extra, sizeof extra, " regs=%lu live=%ld", n_reg - r0, (long)n_live);
    report(name, t, t1, iters, extra);
    if (n_reg - r0 != (unsigned long)iters) { fprintf(stderr, "evict: a case hit (%lu regs)\n", n_reg - r0); exit(2); }
}

/* ------------------------------------------------------------------ 2-thread workload */
/* latency histogram in TSC cycles: exact below 1024, then 16 buckets per octave */
#define NB (1024 + 54 * 16)
struct hist { uint64_t b[NB]; uint64_t n; uint64_t max; };
static inline void hist_add(struct hist *h, uint64_t cyc)
{
    unsigned idx;
    if (cyc < 1024) idx = (unsigned)cyc;
    else {
        unsigned e = 63 - __builtin_clzll(cyc);
        idx = 1024 + (e - 10) * 16 + (unsigned)((cyc >> (e - 4)) & 15);
    }
    if (idx >= NB) idx = NB - 1;
    h->b[idx]++; h->n++;
    if (cyc > h->max) h->max = cyc;
}
static double hist_q(const struct hist *h, double q, double ns_per_cyc)
{
    uint64_t want = (uint64_t)(q * h->n), acc = 0;
    for (unsigned i = 0; i < NB; i++) {
        acc += h->b[i];
        if (acc > want) {
            if (i < 1024) return (i + 0.5) * ns_per_cyc;
            unsigned e = (i - 1024) / 16 + 10, sub = (i - 1024) % 16;
            return (16 + sub + 0.5) * (double)(1ull << (e - 4)) * ns_per_cyc;
        }
    }
    return h->max * ns_per_cyc;
}

static __thread int on_b;
static atomic_ulong b_misses;
static void registrar_on_reg(void) { if (on_b) atomic_fetch_add_explicit(&b_misses, 1, memory_order_relaxed); }
/* Deregistrations B's thread performed: a cache that hands A's evictions to
 * whichever thread comes next shows A's misses above the registrar's bound,
 * paid for by B. */
static atomic_ulong b_deregs;
static void registrar_on_dereg(void) { if (on_b) atomic_fetch_add_explicit(&b_deregs, 1, memory_order_relaxed); }
static atomic_int mt_go, mt_stop;
static uintptr_t pool_base, hot_base;
static int pool_n, hot_n;
#define ABUF (256 * KIB)
#define BBUF (64 * KIB)
static int a_fresh; /* mt-noevict: A misses on fresh regions of an untouched arena, no limit */
static uintptr_t fresh_base;
static uint64_t fresh_n;
#define FRESH_REGION (8 * KIB)
struct a_res { uint64_t ops; struct hist h; };
struct b_res { uint64_t ops; struct hist h; };

static void *thread_a(void *p)
{
    struct a_res *r = p;
    while (!atomic_load(&mt_go)) ;
    uint64_t k = 0;
    while (!atomic_load_explicit(&mt_stop, memory_order_relaxed)) {
        static uint64_t next_fresh;
        if (a_fresh && next_fresh == fresh_n) break; /* arena used up: A stops (reported by its rate) */
        uint64_t c0 = __rdtsc();
        if (a_fresh) get_put(fresh_base + next_fresh++ * FRESH_REGION, FRESH_REGION);
        else get_put(pool_base + (k % pool_n) * ABUF, ABUF);
        hist_add(&r->h, __rdtsc() - c0);
        k++;
    }
    r->ops = k;
    return NULL;
}
static void *thread_b(void *p)
{
    struct b_res *r = p;
    struct rng g = { SEED };
    on_b = 1;
    while (!atomic_load(&mt_go)) ;
    uint64_t k = 0;
    while (!atomic_load_explicit(&mt_stop, memory_order_relaxed)) {
        uintptr_t a = hot_base + below(&g, hot_n) * BBUF;
        uint64_t c0 = __rdtsc();
        get_put(a, BBUF);
        hist_add(&r->h, __rdtsc() - c0);
        k++;
    }
    r->ops = k;
    return NULL;
}

static double tsc_ns_per_cyc(void)
{
    double w0 = wall_ns(); uint64_t c0 = __rdtsc();
    usleep(50000);
    double w1 = wall_ns(); uint64_t c1 = __rdtsc();
    return (w1 - w0) / (double)(c1 - c0);
}

static void mt_phase(const char *phase, int use_a, int use_b, double secs, double npc)
{
    static struct a_res ra; static struct b_res rb;
    memset(&ra, 0, sizeof ra); memset(&rb, 0, sizeof rb);
    atomic_store(&mt_go, 0); atomic_store(&mt_stop, 0);
    pthread_t ta, tb;
    if (use_a) pthread_create(&ta, NULL, thread_a, &ra);
    if (use_b) pthread_create(&tb, NULL, thread_b, &rb);
    unsigned long r0 = n_reg, bm0 = b_misses, d0 = n_dereg, bd0 = b_deregs;
    struct mark t0 = now();
    atomic_store(&mt_go, 1);
    usleep((useconds_t)(secs * 1e6));
    atomic_store(&mt_stop, 1);
    if (use_a) pthread_join(ta, NULL);
    if (use_b) pthread_join(tb, NULL);
    struct mark t1 = now();
    double el = (t1.w - t0.w) / 1e9;
    printf("mt-%s reg=%s", phase, reg_name());
    if (use_a) printf(" A_miss_per_s=%.0f A_p50_us=%.2f A_p99_us=%.2f", ra.ops / el,
                      hist_q(&ra.h, 0.5, npc) / 1e3, hist_q(&ra.h, 0.99, npc) / 1e3);
    if (use_b) printf(" B_hit_per_s=%.0f B_p50_ns=%.1f B_p99_ns=%.1f B_p999_ns=%.1f B_max_us=%.1f", rb.ops / el,
                      hist_q(&rb.h, 0.5, npc), hist_q(&rb.h, 0.99, npc), hist_q(&rb.h, 0.999, npc), rb.h.max * npc / 1e3);
    printf(" regs=%lu B_misses=%lu deregs=%lu B_deregs=%lu cpu_util=%.2f\n", n_reg - r0, b_misses - bm0,
           (unsigned long)(n_dereg - d0), (unsigned long)(b_deregs - bd0), (t1.c - t0.c) / (t1.w - t0.w));
    fflush(stdout);
}

static void w_mt(double secs)
{
    pool_n = getenv("POOL") ? atoi(getenv("POOL")) : 64;
    hot_n = getenv("HOT") ? atoi(getenv("HOT")) : 8;
    unsigned long maxr = getenv("MAXR") ? atol(getenv("MAXR")) : 32;
    double npc = tsc_ns_per_cyc();
    if (a_fresh) {
        maxr = 0; /* no limit: A's misses never evict */
        fresh_n = 1ul << 20;
        fresh_base = reserve(fresh_n * FRESH_REGION, 0);
    }
    be_init(maxr);
    pool_base = reserve((size_t)pool_n * ABUF, 1);
    hot_base = reserve((size_t)hot_n * BBUF, 1);
    for (int i = 0; i < 2 * pool_n; i++) get_put(pool_base + (size_t)(i % pool_n) * ABUF, ABUF); /* warm the evicting steady state */
    for (int i = 0; i < hot_n; i++) get_put(hot_base + (size_t)i * BBUF, BBUF);
    mt_phase("Balone", 0, 1, secs, npc);
    mt_phase("Aalone", 1, 0, secs, npc);
    mt_phase("AB", 1, 1, secs, npc);
    /* the hot set must still be cached: B's entries are never evicted by A */
    unsigned long r0 = n_reg;
    for (int i = 0; i < hot_n; i++) get_put(hot_base + (size_t)i * BBUF, BBUF);
    if (n_reg != r0) printf("mt-note: %lu of B's hot entries had been evicted\n", n_reg - r0);
}

static void w_regcost(long n)
{
    uintptr_t b = reserve(16 * ABUF, 1);
    struct mark t0 = now();
    for (long k = 0; k < n; k++) {
        uint64_t h;
        if (registrar_reg((void *)(b + (k % 16) * ABUF), ABUF, &h)) exit(2);
        registrar_dereg(h);
    }
    struct mark t1 = now();
    char extra[64];
    snprintf(extra, sizeof extra, " reg=%s bytes=%lu", reg_name(), ABUF);
    report("regcost", t0, t1, n, extra);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    registrar_init();
    const char *w = argc > 1 ? argv[1] : "";
#define ARG(i) (argc > (i) ? atol(argv[i]) : (fprintf(stderr, "missing argument %d\n", i), exit(2), 0L))
    printf("# backend=%s reg=%s\n", BE_NAME, reg_name());
    if (!strcmp(w, "hit")) w_hit(ARG(2), ARG(3), argc > 4 && !strcmp(argv[4], "seq"));
    else if (!strcmp(w, "fill")) w_fill(ARG(2));
    else if (!strcmp(w, "evict")) w_evict(ARG(2), ARG(3), ARG(4));
    else if (!strcmp(w, "mt")) w_mt(argc > 2 ? atof(argv[2]) : 2.0);
    else if (!strcmp(w, "mt-noevict")) { a_fresh = 1; w_mt(argc > 2 ? atof(argv[2]) : 2.0); }
    else if (!strcmp(w, "regcost")) w_regcost(ARG(2));
    else { fprintf(stderr, "usage: see head of pb.c\n"); return 2; }
    fflush(stdout);
    _exit(0); /* no destroy: UCX asserts on leftovers, grdma needs finalize; not measured */
}
