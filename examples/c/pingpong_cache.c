/* pingpong_cache.c: a ping-pong loop that registers its buffer through
 * libmrcache. The registrar is a counting one (it stands for ibv_reg_mr: each
 * registration is a malloc'd record freed at deregistration). Shows:
 *   - hits: 1 registration for N acquires of the same buffer;
 *   - a munmap invalidation seen by the userfaultfd monitor (no call from the
 *     program), after which the re-mapped buffer is registered afresh;
 *   - the stats.
 * Exits 0 if every count is as expected, 1 otherwise. Where userfaultfd is
 * unavailable (also under valgrind, which does not know the syscall) it says
 * so and reports the munmap with mrcache_invalidate instead, unless
 * MRCACHE_REQUIRE_UFFD is set: then it fails.
 *
 * Build against an installed libmrcache:
 *   cc pingpong_cache.c $(pkg-config --cflags --libs mrcache) -o pingpong_cache
 */
#include <mrcache.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

struct counts { unsigned long reg, dereg; };
struct mr { void *addr; size_t len; uint32_t key; };

static int count_reg(void *ctx, void *addr, size_t len, uint32_t access,
                     void **handle, uint32_t *lkey, uint32_t *rkey) {
  struct counts *c = ctx;
  struct mr *mr = malloc(sizeof *mr);
  (void)access;
  if (!mr) return 12; /* ENOMEM: the cache evicts and retries once */
  mr->addr = addr; mr->len = len; mr->key = (uint32_t)++c->reg;
  *handle = mr; *lkey = mr->key; *rkey = mr->key | 0x10000u;
  return 0;
}

static int count_dereg(void *ctx, void *handle) {
  ((struct counts *)ctx)->dereg++;
  free(handle);
  return 0;
}

#define CHECK(call) do { mrcache_status_t st_ = (call); if (st_ != MRCACHE_OK) { \
  fprintf(stderr, "%s: %s: %s\n", #call, mrcache_status_name(st_), mrcache_last_error(NULL)); \
  return 1; } } while (0)
#define EXPECT(cond) do { if (!(cond)) { fprintf(stderr, "expected: %s\n", #cond); return 1; } } while (0)

int main(void) {
  enum { LEN = 64 << 10, ROUNDS = 1000 };
  struct counts counts = {0, 0};
  mrcache_registrar_t registrar = { &counts, count_reg, count_dereg };
  mrcache_config_t config;
  mrcache_t *cache;
  mrcache_lease_t lease;
  mrcache_stats_t stats = { .size = sizeof stats };
  CHECK(mrcache_config_init(&config));
  config.monitor = MRCACHE_MONITOR_UFFD;
  mrcache_status_t st = mrcache_create(&config, &registrar, &cache);
  int uffd = st == MRCACHE_OK;
  if (st == MRCACHE_UNSUPPORTED && getenv("MRCACHE_REQUIRE_UFFD")) {
    fprintf(stderr, "MRCACHE_REQUIRE_UFFD is set but: %s\n", mrcache_last_error(NULL));
    return 1;
  }
  if (st == MRCACHE_UNSUPPORTED) {
    /* No userfaultfd here (kernel, permissions, or valgrind, which does not
     * know the syscall): report munmaps ourselves. */
    printf("userfaultfd monitor unavailable (%s); using mrcache_invalidate\n", mrcache_last_error(NULL));
    config.monitor = MRCACHE_MONITOR_EXPLICIT;
    st = mrcache_create(&config, &registrar, &cache);
  }
  CHECK(st);

  char *buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  EXPECT(buf != MAP_FAILED);
  for (int i = 0; i < ROUNDS; i++) {
    uint32_t lkey, rkey;
    CHECK(mrcache_acquire(cache, buf, LEN, MRCACHE_ACCESS_LOCAL_WRITE, &lease));
    CHECK(mrcache_lease_keys(cache, lease, &lkey, &rkey));
    buf[i % LEN] = (char)lkey; /* "post a send" with the keys, then complete it */
    CHECK(mrcache_release(cache, lease));
  }
  CHECK(mrcache_stats(cache, &stats));
  printf("%d round trips: %lu hits, %lu misses, %lu registration(s)\n", ROUNDS,
         (unsigned long)stats.hits, (unsigned long)stats.misses, counts.reg);
  EXPECT(stats.hits == ROUNDS - 1 && stats.misses == 1 && counts.reg == 1);

  /* The application frees the buffer: the cached registration must go. */
  EXPECT(munmap(buf, LEN) == 0);
  if (!uffd) CHECK(mrcache_invalidate(cache, buf, LEN));
  CHECK(mrcache_stats(cache, &stats));
  printf("munmap: %lu invalidation(s) (%s), %lu deregistration(s)\n", (unsigned long)stats.invalidations,
         uffd ? "seen by the userfaultfd monitor" : "reported with mrcache_invalidate",
         (unsigned long)stats.deregistrations);
  EXPECT(stats.invalidations == 1);

  /* A new buffer (maybe at the same address) is registered afresh. */
  buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  EXPECT(buf != MAP_FAILED);
  CHECK(mrcache_acquire(cache, buf, LEN, MRCACHE_ACCESS_LOCAL_WRITE, &lease));
  EXPECT(mrcache_destroy(cache) == MRCACHE_BUSY); /* a lease is held */
  CHECK(mrcache_release(cache, lease));
  CHECK(mrcache_stats(cache, &stats));
  printf("stats: acquires %lu, hits %lu, misses %lu, registrations %lu, deregistrations %lu, "
         "invalidations %lu, cached %lu, pinned bytes %lu\n",
         (unsigned long)stats.acquires, (unsigned long)stats.hits, (unsigned long)stats.misses,
         (unsigned long)stats.registrations, (unsigned long)stats.deregistrations,
         (unsigned long)stats.invalidations, (unsigned long)stats.cached_entries,
         (unsigned long)stats.pinned_bytes);
  EXPECT(stats.misses == 2 && counts.reg == 2);
  CHECK(mrcache_destroy(cache));
  munmap(buf, LEN);
  printf("destroyed: %lu registrations, %lu deregistrations\n", counts.reg, counts.dereg);
  EXPECT(counts.reg == counts.dereg);
  return 0;
}
