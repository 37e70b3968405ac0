/* The C half of bench/capi/run.sh: mrcache_acquire + mrcache_release of one
 * cached 64 KiB registration (a counting registrar), on one thread and with a
 * partner thread hitting the same registration. Prints `name ns_per_op`: the
 * best of ROUNDS runs of ITERS iterations (environment; defaults 5, 10^7). */
#include <mrcache.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define LEN (64u << 10)
static char *const BASE = (char *)(uintptr_t)0x100000000;
static atomic_ulong registered;
static atomic_int stop;

static int reg(void *ctx, void *addr, size_t len, uint32_t access, void **h, uint32_t *lkey, uint32_t *rkey) {
  (void)ctx; (void)len; (void)access;
  unsigned long n = atomic_fetch_add(&registered, 1) + 1;
  *h = addr; *lkey = (uint32_t)n; *rkey = (uint32_t)n;
  return 0;
}
static int dereg(void *ctx, void *h) { (void)ctx; (void)h; return 0; }

static void hits(mrcache_t *cache, unsigned long n) {
  for (unsigned long i = 0; i < n; i++) {
    mrcache_lease_t l;
    if (mrcache_acquire(cache, BASE, LEN, MRCACHE_ACCESS_LOCAL_WRITE, &l) != MRCACHE_OK ||
        mrcache_release(cache, l) != MRCACHE_OK) {
      fprintf(stderr, "hit failed: %s\n", mrcache_last_error(NULL));
      exit(1);
    }
  }
}

static double best(mrcache_t *cache, unsigned long rounds, unsigned long iters) {
  double b = 1e30;
  for (unsigned long r = 0; r < rounds; r++) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    hits(cache, iters);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / iters;
    if (ns < b) b = ns;
  }
  return b;
}

static void *partner(void *cache) {
  while (!atomic_load_explicit(&stop, memory_order_relaxed)) hits(cache, 1024);
  return NULL;
}

int main(void) {
  unsigned long rounds = getenv("ROUNDS") ? strtoul(getenv("ROUNDS"), NULL, 10) : 5;
  unsigned long iters = getenv("ITERS") ? strtoul(getenv("ITERS"), NULL, 10) : 10000000;
  mrcache_registrar_t r = { NULL, reg, dereg };
  mrcache_config_t cfg;
  mrcache_t *cache;
  mrcache_config_init(&cfg);
  if (mrcache_create(&cfg, &r, &cache) != MRCACHE_OK) return 1;
  hits(cache, 1);
  printf("c_1t %.2f\n", best(cache, rounds, iters));
  pthread_t t;
  pthread_create(&t, NULL, partner, cache);
  printf("c_2t %.2f\n", best(cache, rounds, iters));
  atomic_store(&stop, 1);
  pthread_join(t, NULL);
  if (atomic_load(&registered) != 1) return 1;
  return mrcache_destroy(cache) == MRCACHE_OK ? 0 : 1;
}
