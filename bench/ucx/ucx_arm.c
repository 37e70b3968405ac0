/* ucx_arm.c: the UCX arm of bench/ucx/run.sh.
 *
 * Drives UCX's ucs_rcache (Debian libucx-dev, -lucs -lucm) through the same
 * workloads, with the same address sequences, as impl/examples/ucx_side.rs
 * drives mrcache. The registrar callbacks only count. Every result is one
 * line:  <workload> <metric>=<value> ...   (see bench/ucx/README.md).
 *
 *   ucx_arm hit64k ITERS           get+put of one 64 KiB buffer
 *   ucx_arm hit N ITERS [seq]      N adjacent 8 KiB regions, warmed by N misses, then
 *                                  ITERS get+put at random regions (or in order)
 *   ucx_arm fill N                 N cold misses into an empty cache, then 1,000
 *                                  more (the marginal miss at N); RSS per entry
 *   ucx_arm evict N MAX ITERS      max_regions = MAX, regions cycled in order over N
 *   ucx_arm hit2t N ITERS          2 threads, each random over its own N/2 regions
 *   ucx_arm overlap N ITERS        N entries of 16 KiB at an 8 KiB stride; fill, then random hits
 *   ucx_arm unmap N ITERS          release events in a cache of N entries: munmap of a
 *                                  page no entry touches, and of one page of one entry
 */
#define _GNU_SOURCE
#include <ucs/memory/rcache.h>
#include <ucs/type/status.h>
#include <ucm/api/ucm.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define KIB 1024ul
#define REGION (8 * KIB)
#define PROT (PROT_READ | PROT_WRITE)

struct counted_region {
    ucs_rcache_region_t super;
    unsigned long serial;
};

static unsigned long n_reg, n_dereg;

static ucs_status_t count_reg(void *ctx, ucs_rcache_t *rc, void *arg, ucs_rcache_region_t *r, uint16_t flags)
{
    (void)ctx; (void)rc; (void)arg; (void)flags;
    ((struct counted_region *)r)->serial = ++n_reg;
    return UCS_OK;
}

static void count_dereg(void *ctx, ucs_rcache_t *rc, ucs_rcache_region_t *r)
{
    (void)ctx; (void)rc; (void)r;
    n_dereg++;
}

static void describe(void *ctx, ucs_rcache_t *rc, ucs_rcache_region_t *r, char *buf, size_t max)
{
    (void)ctx; (void)rc;
    snprintf(buf, max, "serial %lu", ((struct counted_region *)r)->serial);
}

static const ucs_rcache_ops_t counting_ops = { .mem_reg = count_reg, .mem_dereg = count_dereg, .dump_region = describe };

static ucs_rcache_t *new_rcache(unsigned long max_regions)
{
    ucs_rcache_params_t p;
    ucs_rcache_t *rc;
    memset(&p, 0, sizeof(p));
    p.region_struct_size = sizeof(struct counted_region);
    p.alignment = 4096;
    p.max_alignment = 4096;
    p.ucm_events = UCM_EVENT_VM_UNMAPPED; /* what UCT's IB transport asks for */
    p.ucm_event_priority = 1000;
    p.ops = &counting_ops;
    p.max_regions = max_regions;
    p.max_size = SIZE_MAX;
    p.max_unreleased = SIZE_MAX;
    ucs_status_t st = ucs_rcache_create(&p, "ucx-arm", NULL, &rc);
    if (st != UCS_OK) {
        fprintf(stderr, "ucx_arm: ucs_rcache_create: %s\n", ucs_status_string(st));
        exit(2);
    }
    return rc;
}

/* A point in time: wall clock and the CPU time of the whole process (all
 * threads, user and system). On a shared machine the CPU time is the
 * steadier figure: it does not count the time other processes run. */
struct mark { double wall, cpu; };

static struct mark now(void)
{
    struct timespec w, c;
    clock_gettime(CLOCK_MONOTONIC, &w);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c);
    return (struct mark){ w.tv_sec * 1e9 + w.tv_nsec, c.tv_sec * 1e9 + c.tv_nsec };
}

/* Prints "<name> ns=<wall per op> cpu=<cpu per op><extra>". */
static void report(const char *name, struct mark a, struct mark b, double ops, const char *extra)
{
    printf("%s ns=%.2f cpu=%.2f%s\n", name, (b.wall - a.wall) / ops, (b.cpu - a.cpu) / ops, extra ? extra : "");
}

/* Address space only (never touched): the registrar does not pin. */
static uintptr_t reserve(size_t len)
{
    size_t align = 1ul << 20;
    void *p = mmap(NULL, len + align, PROT, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); exit(2); }
    return ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
}

static long rss_bytes(void)
{
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f || fscanf(f, "%ld %ld", &pages, &rss) != 2) { perror("statm"); exit(2); }
    fclose(f);
    return rss * sysconf(_SC_PAGESIZE);
}

/* The shared address sequence: xorshift64*, then Lemire's reduction to [0, n). */
struct rng { uint64_t s; };
#define SEED 0x9E3779B97F4A7C15ull
static inline uint32_t below(struct rng *g, uint32_t n)
{
    uint64_t x = g->s;
    x ^= x >> 12; x ^= x << 25; x ^= x >> 27;
    g->s = x;
    return (uint32_t)((((x * 0x2545F4914F6CDD1Dull) >> 32) * n) >> 32);
}

static void get_put(ucs_rcache_t *rc, uintptr_t addr, size_t len)
{
    ucs_rcache_region_t *r;
    ucs_status_t st = ucs_rcache_get(rc, (void *)addr, len, PROT, NULL, &r);
    if (st != UCS_OK) { fprintf(stderr, "ucx_arm: get: %s\n", ucs_status_string(st)); exit(2); }
    ucs_rcache_region_put(rc, r);
}

static void hit64k(long iters)
{
    ucs_rcache_t *rc = new_rcache(ULONG_MAX);
    uintptr_t buf = reserve(64 * KIB);
    get_put(rc, buf, 64 * KIB);
    struct mark t = now();
    for (long k = 0; k < iters; k++) get_put(rc, buf, 64 * KIB);
    report("hit64k", t, now(), iters, NULL);
    ucs_rcache_destroy(rc);
}

static void hit(uint32_t n, long iters, int seq)
{
    ucs_rcache_t *rc = new_rcache(ULONG_MAX);
    uintptr_t base = reserve((size_t)n * REGION);
    for (uint32_t i = 0; i < n; i++) get_put(rc, base + (size_t)i * REGION, REGION);
    struct rng g = { SEED };
    uint32_t i = 0;
    struct mark t = now();
    for (long k = 0; k < iters; k++) {
        uint32_t j = seq ? i : below(&g, n);
        if (++i == n) i = 0;
        get_put(rc, base + (size_t)j * REGION, REGION);
    }
    char name[64];
    snprintf(name, sizeof(name), "hit%s/%u", seq ? "-seq" : "", n);
    report(name, t, now(), iters, NULL);
    ucs_rcache_destroy(rc);
}

static void fill(uint32_t n)
{
    const uint32_t extra = 1000;
    long rss0 = rss_bytes();
    ucs_rcache_t *rc = new_rcache(ULONG_MAX);
    uintptr_t base = reserve((size_t)(n + extra) * REGION);
    struct mark t0 = now();
    for (uint32_t i = 0; i < n; i++) get_put(rc, base + (size_t)i * REGION, REGION);
    struct mark t1 = now();
    long rss1 = rss_bytes();
    struct mark t2 = now();
    for (uint32_t i = n; i < n + extra; i++) get_put(rc, base + (size_t)i * REGION, REGION);
    struct mark t3 = now();
    char name[64];
    snprintf(name, sizeof(name), "fill/%u", n);
    report(name, t0, t1, n, NULL);
    snprintf(name, sizeof(name), "marginal/%u", n);
    report(name, t2, t3, extra, NULL);
    printf("rss/%u bytes=%.1f\n", n, (double)(rss1 - rss0) / n);
    if (n_reg != n + extra) { fprintf(stderr, "ucx_arm: fill registered %lu\n", n_reg); exit(2); }
    ucs_rcache_destroy(rc);
}

static void evict(uint32_t n, unsigned long max, long iters)
{
    ucs_rcache_t *rc = new_rcache(max);
    uintptr_t base = reserve((size_t)n * REGION);
    long k;
    for (k = 0; k < (long)max; k++) get_put(rc, base + (size_t)(k % n) * REGION, REGION);
    unsigned long r0 = n_reg, d0 = n_dereg;
    struct mark t = now();
    for (; k < (long)max + iters; k++) get_put(rc, base + (size_t)(k % n) * REGION, REGION);
    char name[64];
    snprintf(name, sizeof(name), "evict/%u/%lu", n, max);
    report(name, t, now(), iters, NULL);
    if (n_reg - r0 != (unsigned long)iters || n_dereg - d0 < (unsigned long)iters - max) {
        fprintf(stderr, "ucx_arm: evict: %lu registrations, %lu deregistrations\n", n_reg - r0, n_dereg - d0);
        exit(2);
    }
    ucs_rcache_destroy(rc);
}

struct worker { ucs_rcache_t *rc; uintptr_t base; uint32_t n; long iters; uint64_t seed; pthread_barrier_t *go; };

static void *hit_worker(void *p)
{
    struct worker *w = p;
    struct rng g = { w->seed };
    pthread_barrier_wait(w->go);
    for (long k = 0; k < w->iters; k++) get_put(w->rc, w->base + (size_t)below(&g, w->n) * REGION, REGION);
    return NULL;
}

static void hit2t(uint32_t n, long iters)
{
    ucs_rcache_t *rc = new_rcache(ULONG_MAX);
    uintptr_t base = reserve((size_t)n * REGION);
    for (uint32_t i = 0; i < n; i++) get_put(rc, base + (size_t)i * REGION, REGION);
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, 3);
    struct worker w[2];
    pthread_t th[2];
    for (int t = 0; t < 2; t++) {
        w[t] = (struct worker){ rc, base + (size_t)t * (n / 2) * REGION, n / 2, iters, SEED + (uint64_t)t, &go };
        pthread_create(&th[t], NULL, hit_worker, &w[t]);
    }
    pthread_barrier_wait(&go);
    struct mark t0 = now();
    for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
    struct mark t1 = now();
    /* Wall time per get+put per thread; CPU time per get+put. */
    printf("hit2t/%u ns=%.2f cpu=%.2f\n", n, (t1.wall - t0.wall) / iters, (t1.cpu - t0.cpu) / (2.0 * iters));
    ucs_rcache_destroy(rc);
}

static void overlap(uint32_t n, long iters)
{
    ucs_rcache_t *rc = new_rcache(ULONG_MAX);
    uintptr_t base = reserve((size_t)(n + 1) * REGION);
    struct mark t0 = now();
    for (uint32_t i = 0; i < n; i++) get_put(rc, base + (size_t)i * REGION, 2 * REGION);
    struct mark t1 = now();
    struct rng g = { SEED };
    struct mark t2 = now();
    for (long k = 0; k < iters; k++) get_put(rc, base + (size_t)below(&g, n) * REGION, 2 * REGION);
    struct mark t3 = now();
    char name[64], extra[64];
    snprintf(name, sizeof(name), "overlap-fill/%u", n);
    snprintf(extra, sizeof(extra), " regs=%lu", n_reg);
    report(name, t0, t1, n, extra);
    snprintf(name, sizeof(name), "overlap-hit/%u", n);
    report(name, t2, t3, iters, NULL);
    ucs_rcache_destroy(rc);
}

static void unmap(uint32_t n, long iters)
{
    ucs_rcache_t *rc = new_rcache(ULONG_MAX);
    uintptr_t base = reserve((size_t)n * REGION);
    for (uint32_t i = 0; i < n; i++) get_put(rc, base + (size_t)i * REGION, REGION);
    /* Pages no entry touches, one mapping each. */
    uintptr_t *spare = malloc(iters * sizeof(*spare));
    for (long k = 0; k < iters; k++) spare[k] = reserve(4096);
    struct mark t0 = now();
    for (long k = 0; k < iters; k++) munmap((void *)spare[k], 4096);
    struct mark t1 = now();
    unsigned long d0 = n_dereg;
    struct mark t2 = now();
    for (long k = 0; k < iters; k++) munmap((void *)(base + (size_t)k * REGION), 4096);
    struct mark t3 = now();
    /* UCX may have queued some (hook without the lock): one get drains. */
    get_put(rc, base + (size_t)(n - 1) * REGION, REGION);
    char name[64], extra[64];
    snprintf(name, sizeof(name), "unmap-none/%u", n);
    report(name, t0, t1, iters, NULL);
    snprintf(name, sizeof(name), "unmap-one/%u", n);
    snprintf(extra, sizeof(extra), " deregs=%lu", n_dereg - d0);
    report(name, t2, t3, iters, extra);
    free(spare);
    ucs_rcache_destroy(rc);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *w = argc > 1 ? argv[1] : "";
#define ARG(i) (argc > (i) ? atol(argv[i]) : (fprintf(stderr, "ucx_arm %s: missing argument %d\n", w, i), exit(2), 0L))
    if (!strcmp(w, "hit64k")) hit64k(ARG(2));
    else if (!strcmp(w, "hit")) hit(ARG(2), ARG(3), argc > 4 && !strcmp(argv[4], "seq"));
    else if (!strcmp(w, "fill")) fill(ARG(2));
    else if (!strcmp(w, "evict")) evict(ARG(2), ARG(3), ARG(4));
    else if (!strcmp(w, "hit2t")) hit2t(ARG(2), ARG(3));
    else if (!strcmp(w, "overlap")) overlap(ARG(2), ARG(3));
    else if (!strcmp(w, "unmap")) unmap(ARG(2), ARG(3));
    else { fprintf(stderr, "usage: see the head of ucx_arm.c\n"); return 2; }
    return 0;
}
