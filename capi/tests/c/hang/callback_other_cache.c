/* callback_other_cache.c: dereg callbacks of one monitored cache (A) that
 * call into other monitored caches, on the monitor's side.
 *
 * The header lets a callback do "anything on another cache". Every
 * monitored cache shares the process's one monitor, so a callback that the
 * monitor runs and that destroys a monitored cache (detaches it from the
 * monitor, maybe stops the monitor), creates one (attaches), or acquires in
 * one (registers and watches a range) reenters the monitor from its own
 * side. Each round munmaps a page of memory registered in A; the monitor
 * invalidates the registration and A's `dereg` then, by mode:
 *   a. destroys cache B (which holds cached registrations of its own);
 *   b. creates cache C (the test then uses C: acquire, munmap of registered
 *      memory seen by the monitor, destroy);
 *   c. acquires and releases in cache D (a miss: registers and watches).
 * The test waits for the callback's result (no deadline: a hang is the
 * watchdog's), checks each status, and the registrars' counters at the end.
 *
 *   callback_other_cache [ROUNDS]  rounds of each mode (or HANG_ITERS; default 20)
 *   HANG_MODE=a|b|c                only that mode (default: all, in order) */
#define _GNU_SOURCE
#include "hang_common.h"

enum { NONE, DESTROY_B, CREATE_C, USE_D };
static atomic_int action, done;
static mrcache_t *cache_b, *cache_c, *cache_d;
static struct hc_reg rb, rc, rd;
static mrcache_status_t result;
static char *d_buf;
static size_t page;

static void on_a_dereg(struct hc_reg *r, struct hc_rec *rec) {
  (void)r; (void)rec;
  int what = atomic_exchange(&action, NONE);
  if (what == NONE) return;
  switch (what) {
  case DESTROY_B:
    result = mrcache_destroy(cache_b);
    break;
  case CREATE_C: {
    mrcache_config_t cfg;
    mrcache_registrar_t reg = hc_registrar(&rc);
    mrcache_config_init(&cfg);
    cfg.monitor = MRCACHE_MONITOR_UFFD;
    result = mrcache_create(&cfg, &reg, &cache_c);
    break;
  }
  case USE_D: {
    mrcache_lease_t l;
    result = mrcache_acquire(cache_d, d_buf, 4 * page, MRCACHE_ACCESS_LOCAL_WRITE, &l);
    if (result == MRCACHE_OK) result = mrcache_release(cache_d, l);
    break;
  }
  }
  atomic_store(&done, 1);
}

/* One round on A: register 4 pages, munmap one; the callback does `what`. */
static void round_on_a(mrcache_t *a, int what, const char *name) {
  char *buf = hc_map(4 * page);
  hc_touch(a, buf, 4 * page);
  atomic_store(&done, 0);
  result = MRCACHE_INTERNAL;
  atomic_store(&action, what);
  EXPECT(munmap(buf, page) == 0);
  while (!atomic_load(&done)) usleep(200);
  if (result != MRCACHE_OK) {
    fprintf(stderr, "%s: in A's dereg: %s gave %s\n", hc_name, name, mrcache_status_name(result));
    atomic_fetch_add(&hc_failures, 1);
  }
  EXPECT(munmap(buf + page, 3 * page) == 0);
}

int main(int argc, char **argv) {
  hc_init("callback_other_cache");
  long rounds = hc_param(argc, argv, "HANG_ITERS", 20);
  const char *mode = getenv("HANG_MODE");
  page = hc_page();
  static struct hc_reg ra = { .on_dereg = on_a_dereg };
  mrcache_t *a = hc_create(&ra);

  if (!mode || strchr(mode, 'a')) {
    printf("callback_other_cache: a. %ld x A's dereg (monitor side) destroys cache B\n", rounds);
    for (long i = 0; i < rounds; i++) {
      cache_b = hc_create(&rb);
      char *b1 = hc_map(2 * page), *b2 = hc_map(2 * page);
      hc_touch(cache_b, b1, 2 * page);
      hc_touch(cache_b, b2, 2 * page);
      round_on_a(a, DESTROY_B, "mrcache_destroy(B)");
      hc_check_balanced("B after its destroy in A's dereg", &rb);
      /* B's memory is no longer cached anywhere: these return. */
      HC_TIMED("munmap of B's memory", 1.0, munmap(b1, 2 * page));
      HC_TIMED("munmap of B's memory", 1.0, munmap(b2, 2 * page));
    }
  }
  if (!mode || strchr(mode, 'b')) {
    printf("callback_other_cache: b. %ld x A's dereg (monitor side) creates cache C\n", rounds);
    for (long i = 0; i < rounds; i++) {
      cache_c = NULL;
      round_on_a(a, CREATE_C, "mrcache_create(C)");
      if (!cache_c) continue;
      char *c1 = hc_map(4 * page);
      unsigned long before = atomic_load(&rc.dereg);
      hc_touch(cache_c, c1, 4 * page);
      EXPECT(munmap(c1, page) == 0); /* C's monitor (the shared one) sees it */
      while (atomic_load(&rc.dereg) == before) usleep(200);
      EXPECT_OK(mrcache_destroy(cache_c));
      EXPECT(munmap(c1 + page, 3 * page) == 0);
    }
    hc_check_balanced("the caches C", &rc);
  }
  if (!mode || strchr(mode, 'c')) {
    printf("callback_other_cache: c. %ld x A's dereg (monitor side) acquires and releases in cache D\n", rounds);
    cache_d = hc_create(&rd);
    for (long i = 0; i < rounds; i++) {
      d_buf = hc_map(4 * page);
      round_on_a(a, USE_D, "mrcache_acquire/release(D)");
      unsigned long before = atomic_load(&rd.dereg);
      EXPECT(munmap(d_buf, 4 * page) == 0); /* D's registration goes */
      while (atomic_load(&rd.dereg) == before) usleep(200);
    }
    mrcache_stats_t s = { .size = sizeof s };
    EXPECT_OK(mrcache_stats(cache_d, &s));
    EXPECT(s.misses == (uint64_t)rounds && s.leases_held == 0);
    EXPECT_OK(mrcache_destroy(cache_d));
    hc_check_balanced("D", &rd);
  }
  EXPECT_OK(mrcache_destroy(a));
  hc_check_balanced("A", &ra);
  return hc_finish();
}
