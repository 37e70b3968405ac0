/* heap_traffic.c: glibc malloc traffic on registered heap memory, with the
 * usual registrar pattern (a record malloc'd in `reg`, freed in `dereg`).
 *
 * Several threads malloc buffers of 1-120 KiB (malloc at its defaults: below
 * the mmap threshold, so from the heap and the thread arenas), acquire them
 * (every third one twice, for hits), release them and free them. A free
 * can shrink the heap (brk), trim an arena (munmap, madvise DONTNEED) over
 * watched pages: the release blocks in the kernel until the monitor has read
 * the event. The monitor's deregistrations run `dereg`, which frees, which
 * can trim, which is a release the monitor itself must read: a monitor that
 * runs callbacks on its reading thread hangs here, as does one that
 * allocates while another thread's release is blocked on it.
 *
 * Checks: every status is MRCACHE_OK; after mrcache_destroy every
 * registration has had its deregistration (the registrar's own counters);
 * some acquires hit.
 *
 *   heap_traffic [ITERATIONS]    per thread (or HANG_ITERS; default 3000)
 *   HANG_THREADS=N               threads (default 4) */
#define _GNU_SOURCE
#include "hang_common.h"
#include <pthread.h>

static mrcache_t *cache;
static long iters;
static atomic_ulong acquires, hits_wanted;

static void *worker(void *arg) {
  unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u + 1;
  char *keep[8] = {0};
  for (long i = 0; i < iters; i++) {
    size_t len = 1024 + (size_t)(rand_r(&seed) % (119 * 1024));
    char *buf = malloc(len);
    if (!buf) {
      EXPECT(buf != NULL);
      continue;
    }
    memset(buf, (int)i, len);
    mrcache_lease_t l;
    mrcache_status_t st = mrcache_acquire(cache, buf, len, MRCACHE_ACCESS_LOCAL_WRITE, &l);
    EXPECT_ST(st, MRCACHE_OK);
    atomic_fetch_add(&acquires, 1);
    if (st == MRCACHE_OK && i % 3 == 0) {
      mrcache_lease_t l2;
      EXPECT_OK(mrcache_acquire(cache, buf, len, MRCACHE_ACCESS_LOCAL_WRITE, &l2));
      EXPECT_OK(mrcache_release(cache, l2));
      atomic_fetch_add(&acquires, 1);
      atomic_fetch_add(&hits_wanted, 1);
    }
    if (st == MRCACHE_OK) EXPECT_OK(mrcache_release(cache, l));
    /* Free some at once and keep some a while: fragmentation, so frees
     * both trim and reuse. */
    int slot = rand_r(&seed) % 8;
    free(keep[slot]);
    keep[slot] = (i % 2) ? buf : NULL;
    if (!(i % 2)) free(buf);
  }
  for (int s = 0; s < 8; s++) free(keep[s]);
  return NULL;
}

int main(int argc, char **argv) {
  hc_init("heap_traffic");
  iters = hc_param(argc, argv, "HANG_ITERS", 3000);
  int nthreads = (int)hc_env("HANG_THREADS", 4);
  static struct hc_reg r;
  cache = hc_create(&r);
  pthread_t t[64];
  if (nthreads > 64) nthreads = 64;
  printf("heap_traffic: %d threads x %ld malloc/acquire/release/free of 1-120 KiB\n", nthreads, iters);
  for (int i = 0; i < nthreads; i++) pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(i + 1));
  for (int i = 0; i < nthreads; i++) pthread_join(t[i], NULL);
  mrcache_stats_t s = { .size = sizeof s };
  EXPECT_OK(mrcache_stats(cache, &s));
  printf("heap_traffic: %lu acquires, %lu hits, %lu misses, %lu registrations, %lu invalidations, %lu uncached\n",
         (unsigned long)s.acquires, (unsigned long)s.hits, (unsigned long)s.misses, (unsigned long)s.registrations,
         (unsigned long)s.invalidations, (unsigned long)s.uncached);
  EXPECT(s.acquires == atomic_load(&acquires));
  EXPECT(s.hits > 0);
  EXPECT(s.errors == 0);
  EXPECT(s.leases_held == 0);
  EXPECT_OK(mrcache_destroy(cache));
  hc_check_balanced("after mrcache_destroy", &r);
  printf("heap_traffic: %lu registrations, %lu deregistrations after destroy\n", atomic_load(&r.reg),
         atomic_load(&r.dereg));
  return hc_finish();
}
