/* hang_common.h: what the hang tests (the .c files of capi/tests/c/hang) share. Only the
 * public header of the library is used; everything here is test code.
 *
 *  - hc_init: line-buffered output (the tests fork; a hang must show the
 *    last step reached), the program's name for messages.
 *  - hc_param: a size (iterations, seconds) from argv[1], else an
 *    environment variable, else a CI default.
 *  - hc_create: a cache with MRCACHE_MONITOR_UFFD; MRCACHE_UNSUPPORTED skips
 *    the test (exit 77) unless MRCACHE_REQUIRE_UFFD=1 (then it fails).
 *  - The usual registrar: `reg` mallocs a record (the handle) with the
 *    registration's addr and len, `dereg` checks and frees it; counters are
 *    atomic (callbacks run on any thread at once). A hook lets a test act in
 *    `dereg` (unmap, free, call into other caches).
 *  - EXPECT/EXPECT_ST count failures (atomically); hc_finish reports them.
 *
 * The tests never wait for the library with a deadline of their own: a hang
 * is left to the watchdog (ci/watchdog.sh), which says where every thread
 * waits. A timing check (a release that must return promptly) is a check. */
#ifndef HANG_COMMON_H
#define HANG_COMMON_H

#include <mrcache.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static atomic_int hc_failures;
static const char *hc_name = "hang";

#define EXPECT(cond) do { if (!(cond)) { \
  fprintf(stderr, "%s: %s:%d: expected %s\n", hc_name, __FILE__, __LINE__, #cond); \
  atomic_fetch_add(&hc_failures, 1); } } while (0)
#define EXPECT_ST(call, want) do { mrcache_status_t st_ = (call); if (st_ != (want)) { \
  fprintf(stderr, "%s: %s:%d: %s gave %s, expected %s (%s)\n", hc_name, __FILE__, __LINE__, #call, \
          mrcache_status_name(st_), #want, mrcache_last_error(NULL)); \
  atomic_fetch_add(&hc_failures, 1); } } while (0)
#define EXPECT_OK(call) EXPECT_ST(call, MRCACHE_OK)

static inline void hc_init(const char *name) {
  hc_name = name;
  setvbuf(stdout, NULL, _IOLBF, 0);
  setvbuf(stderr, NULL, _IONBF, 0);
}

/* argv[1] if given, else $env, else def. */
static inline long hc_param(int argc, char **argv, const char *env, long def) {
  const char *s = argc > 1 ? argv[1] : getenv(env);
  if (s && *s) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*end == '\0' && v > 0) return v;
    fprintf(stderr, "%s: ignoring bad size \"%s\" (a positive integer)\n", hc_name, s);
  }
  return def;
}

/* Another environment variable as a positive integer, or def. */
static inline long hc_env(const char *env, long def) {
  const char *s = getenv(env);
  if (s && *s) {
    long v = strtol(s, NULL, 10);
    if (v > 0) return v;
  }
  return def;
}

static inline double hc_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline size_t hc_page(void) { return (size_t)sysconf(_SC_PAGESIZE); }

/* A fresh private anonymous mapping, touched. */
static inline char *hc_map(size_t len) {
  char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    perror("mmap");
    exit(1);
  }
  memset(p, 0x5a, len);
  return p;
}

/* ---- the registrar ---------------------------------------------------- */

#define HC_MAGIC 0x6d72636163686521ull

struct hc_rec {
  uint64_t magic;
  void *addr;   /* the registration's page-aligned range */
  size_t len;
  void *owner;  /* test data (e.g. a malloc'd buffer to free in dereg) */
  uint32_t key;
};

struct hc_reg;
/* Called by dereg with the record, before it is freed. */
typedef void (*hc_dereg_hook)(struct hc_reg *r, struct hc_rec *rec);
/* Called by reg before it records the registration; a non-zero errno fails it. */
typedef int (*hc_reg_hook)(struct hc_reg *r, void *addr, size_t len);

struct hc_reg {
  atomic_ulong reg, dereg, bad_handles;
  hc_reg_hook on_reg;
  hc_dereg_hook on_dereg;
  void *test; /* for the hooks */
};

/* The owner a thread's next registration records (set before an acquire). */
static _Thread_local void *hc_next_owner;

static int hc_reg_cb(void *ctx, void *addr, size_t len, uint32_t access, void **handle, uint32_t *lkey,
                     uint32_t *rkey) {
  struct hc_reg *r = ctx;
  (void)access;
  if (r->on_reg) {
    int e = r->on_reg(r, addr, len);
    if (e) return e;
  }
  struct hc_rec *rec = malloc(sizeof *rec);
  if (!rec) return 12; /* ENOMEM */
  rec->magic = HC_MAGIC;
  rec->addr = addr;
  rec->len = len;
  rec->owner = hc_next_owner;
  rec->key = (uint32_t)atomic_fetch_add(&r->reg, 1) + 1;
  *handle = rec;
  *lkey = rec->key;
  *rkey = rec->key | 0x10000u;
  return 0;
}

static int hc_dereg_cb(void *ctx, void *handle) {
  struct hc_reg *r = ctx;
  struct hc_rec *rec = handle;
  if (!rec || rec->magic != HC_MAGIC) {
    atomic_fetch_add(&r->bad_handles, 1);
    return 22; /* EINVAL */
  }
  if (r->on_dereg) r->on_dereg(r, rec);
  rec->magic = 0;
  free(rec);
  atomic_fetch_add(&r->dereg, 1);
  return 0;
}

static inline mrcache_registrar_t hc_registrar(struct hc_reg *r) {
  mrcache_registrar_t reg = { r, hc_reg_cb, hc_dereg_cb };
  return reg;
}

/* True if MRCACHE_REQUIRE_UFFD=1. */
static inline int hc_uffd_required(void) {
  const char *req = getenv("MRCACHE_REQUIRE_UFFD");
  return req && strcmp(req, "1") == 0;
}

/* A cache with the userfaultfd monitor and extra config (max_regions).
 * MRCACHE_UNSUPPORTED: skip (77) unless required. Any other failure: exit 1. */
static inline mrcache_t *hc_create_cfg(struct hc_reg *r, uint64_t max_regions) {
  mrcache_config_t cfg;
  mrcache_registrar_t reg = hc_registrar(r);
  mrcache_t *cache = NULL;
  mrcache_config_init(&cfg);
  cfg.monitor = MRCACHE_MONITOR_UFFD;
  cfg.max_regions = max_regions;
  mrcache_status_t st = mrcache_create(&cfg, &reg, &cache);
  if (st == MRCACHE_UNSUPPORTED) {
    if (hc_uffd_required()) {
      fprintf(stderr, "%s: MRCACHE_REQUIRE_UFFD=1 but the userfaultfd monitor is unavailable: %s\n", hc_name,
              mrcache_last_error(NULL));
      exit(1);
    }
    printf("%s: SKIPPED: the userfaultfd monitor is unavailable (%s)\n", hc_name, mrcache_last_error(NULL));
    exit(77);
  }
  if (st != MRCACHE_OK) {
    fprintf(stderr, "%s: mrcache_create gave %s (%s)\n", hc_name, mrcache_status_name(st), mrcache_last_error(NULL));
    exit(1);
  }
  return cache;
}

static inline mrcache_t *hc_create(struct hc_reg *r) { return hc_create_cfg(r, 0); }

/* After the cache is destroyed: every registration was deregistered once. */
static inline void hc_check_balanced(const char *what, struct hc_reg *r) {
  unsigned long reg = atomic_load(&r->reg), dereg = atomic_load(&r->dereg), bad = atomic_load(&r->bad_handles);
  if (reg != dereg || bad) {
    fprintf(stderr, "%s: %s: %lu registrations, %lu deregistrations, %lu bad handles\n", hc_name, what, reg, dereg,
            bad);
    atomic_fetch_add(&hc_failures, 1);
  }
}

/* Acquire then release; counts a failure for any non-OK status. */
static inline void hc_touch(mrcache_t *c, const void *addr, size_t len) {
  mrcache_lease_t l;
  mrcache_status_t st = mrcache_acquire(c, addr, len, MRCACHE_ACCESS_LOCAL_WRITE, &l);
  if (st != MRCACHE_OK) {
    fprintf(stderr, "%s: mrcache_acquire(%p, %zu) gave %s (%s)\n", hc_name, addr, len, mrcache_status_name(st),
            mrcache_last_error(NULL));
    atomic_fetch_add(&hc_failures, 1);
    return;
  }
  EXPECT_OK(mrcache_release(c, l));
}

/* Times a release call; a failure if it fails or takes longer than `limit` s. */
#define HC_TIMED(what, limit, call) do { double t0_ = hc_now(); int rc_ = (call); double dt_ = hc_now() - t0_; \
  if (rc_ != 0) { fprintf(stderr, "%s: %s failed: %s\n", hc_name, what, strerror(errno)); atomic_fetch_add(&hc_failures, 1); } \
  if (dt_ > (limit)) { fprintf(stderr, "%s: %s took %.3f s (limit %.1f s): the release waited for a reader\n", \
                               hc_name, what, dt_, (double)(limit)); atomic_fetch_add(&hc_failures, 1); } } while (0)

static inline int hc_finish(void) {
  int f = atomic_load(&hc_failures);
  if (f) {
    fprintf(stderr, "%s: FAILED: %d checks failed\n", hc_name, f);
    return 1;
  }
  printf("%s: all checks passed\n", hc_name);
  return 0;
}

#endif
