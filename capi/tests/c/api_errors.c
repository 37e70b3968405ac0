/* api_errors.c: the C API's answers to bad arguments and misuse, from C,
 * against the installed header and library (ci/c-tests.sh runs it under
 * valgrind). Each check prints on failure; exits 1 if any failed. */
#include <mrcache.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int failures;
#define EXPECT_ST(call, want) do { mrcache_status_t st_ = (call); if (st_ != (want)) { \
  fprintf(stderr, "%s:%d: %s gave %s, expected %s (%s)\n", __FILE__, __LINE__, #call, \
          mrcache_status_name(st_), #want, mrcache_last_error(NULL)); failures++; } } while (0)
#define EXPECT(cond) do { if (!(cond)) { fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); failures++; } } while (0)

struct ctx { mrcache_t *cache; unsigned long reg, dereg; int fail_errno; mrcache_status_t reentry[5]; int reenter; };

static int reg(void *p, void *addr, size_t len, uint32_t access, void **handle, uint32_t *lkey, uint32_t *rkey) {
  struct ctx *c = p;
  (void)len; (void)access;
  if (c->fail_errno) return c->fail_errno;
  if (c->reenter) {
    mrcache_lease_t l;
    c->reentry[0] = mrcache_acquire(c->cache, (void *)(uintptr_t)0x300000000, 4096, 0, &l);
    c->reentry[1] = mrcache_flush(c->cache);
    c->reentry[2] = mrcache_trim(c->cache);
    c->reentry[3] = mrcache_destroy(c->cache);
    c->reentry[4] = mrcache_invalidate(c->cache, (void *)(uintptr_t)0x400000000, 4096); /* allowed: queues */
  }
  c->reg++;
  *handle = addr; *lkey = (uint32_t)c->reg; *rkey = 7;
  return 0;
}
static int dereg(void *p, void *handle) { (void)handle; ((struct ctx *)p)->dereg++; return 0; }

static void *release_elsewhere(void *arg) {
  void **a = arg;
  mrcache_lease_t *l = a[1];
  return (void *)(uintptr_t)mrcache_release(a[0], *l);
}

int main(void) {
  struct ctx c;
  memset(&c, 0, sizeof c);
  mrcache_registrar_t r = { &c, reg, dereg };
  mrcache_config_t cfg;
  mrcache_t *cache = NULL, *other = NULL;
  mrcache_lease_t l, m;
  mrcache_stats_t s = { .size = sizeof s };
  uint32_t lkey, rkey;
  mrcache_view_t view;
  char *buf = (char *)(uintptr_t)0x100000000;
  int e = -1;

  /* NULL everywhere. */
  EXPECT_ST(mrcache_config_init(NULL), MRCACHE_NULL_ARGUMENT);
  EXPECT_ST(mrcache_config_init(&cfg), MRCACHE_OK);
  EXPECT_ST(mrcache_create(NULL, &r, &cache), MRCACHE_NULL_ARGUMENT);
  EXPECT_ST(mrcache_create(&cfg, NULL, &cache), MRCACHE_NULL_ARGUMENT);
  EXPECT_ST(mrcache_create(&cfg, &r, NULL), MRCACHE_NULL_ARGUMENT);
  EXPECT(strstr(mrcache_last_error(&e), "cache_out is NULL") && e == 0);
  /* Bad configurations and registrars. */
  cfg.overlap = 9;
  EXPECT_ST(mrcache_create(&cfg, &r, &cache), MRCACHE_INVALID_CONFIG);
  mrcache_config_init(&cfg);
  cfg.size = 4;
  EXPECT_ST(mrcache_create(&cfg, &r, &cache), MRCACHE_INVALID_CONFIG);
  mrcache_config_init(&cfg);
  mrcache_registrar_t half = { &c, reg, NULL };
  EXPECT_ST(mrcache_create(&cfg, &half, &cache), MRCACHE_INVALID_CONFIG);
  EXPECT(cache == NULL);
  EXPECT_ST(mrcache_create(&cfg, &r, &cache), MRCACHE_OK);
  EXPECT_ST(mrcache_create(&cfg, &r, &other), MRCACHE_OK);
  c.cache = cache;

  EXPECT_ST(mrcache_acquire(NULL, buf, 4096, 0, &l), MRCACHE_NULL_ARGUMENT);
  EXPECT_ST(mrcache_acquire(cache, buf, 4096, 0, NULL), MRCACHE_NULL_ARGUMENT);
  EXPECT_ST(mrcache_release(NULL, l), MRCACHE_NULL_ARGUMENT);
  EXPECT_ST(mrcache_lease_keys(cache, l, NULL, &rkey), MRCACHE_NULL_ARGUMENT);
  EXPECT_ST(mrcache_lease_keys(cache, l, &lkey, NULL), MRCACHE_NULL_ARGUMENT);
  EXPECT_ST(mrcache_lease_view(cache, l, NULL), MRCACHE_NULL_ARGUMENT);
  EXPECT_ST(mrcache_invalidate(NULL, buf, 1), MRCACHE_NULL_ARGUMENT);
  EXPECT_ST(mrcache_flush(NULL), MRCACHE_NULL_ARGUMENT);
  EXPECT_ST(mrcache_trim(NULL), MRCACHE_NULL_ARGUMENT);
  EXPECT_ST(mrcache_stats(NULL, &s), MRCACHE_NULL_ARGUMENT);
  EXPECT_ST(mrcache_stats(cache, NULL), MRCACHE_NULL_ARGUMENT);
  EXPECT_ST(mrcache_destroy(NULL), MRCACHE_NULL_ARGUMENT);
  EXPECT_ST(mrcache_monitor_start(NULL), MRCACHE_NULL_ARGUMENT);
  EXPECT_ST(mrcache_registrar_verbs(NULL, &r), MRCACHE_NULL_ARGUMENT);
  /* A NULL address is a NULL argument too (it must not register address 0). */
  l.opaque = 42;
  EXPECT_ST(mrcache_acquire(cache, NULL, 4096, 0, &l), MRCACHE_NULL_ARGUMENT);
  EXPECT(strstr(mrcache_last_error(NULL), "addr is NULL") != NULL);
  EXPECT(l.opaque == 0); /* a failed acquire leaves the all-zero lease */
  EXPECT(c.reg == 0);
  EXPECT_ST(mrcache_invalidate(cache, NULL, 4096), MRCACHE_NULL_ARGUMENT);
  EXPECT_ST(mrcache_release_begin(cache, NULL, 4096), MRCACHE_NULL_ARGUMENT);
  EXPECT_ST(mrcache_release_end(cache, NULL, 4096), MRCACHE_NULL_ARGUMENT);

  /* Ranges and flags. */
  l.opaque = 42;
  EXPECT_ST(mrcache_acquire(cache, buf, 0, 0, &l), MRCACHE_EMPTY_RANGE);
  EXPECT(l.opaque == 0);
  EXPECT_ST(mrcache_acquire(cache, (void *)(UINTPTR_MAX - 10), 100, 0, &l), MRCACHE_WRAPPING_RANGE);
  EXPECT_ST(mrcache_acquire(cache, buf, 4096, 0x100, &l), MRCACHE_INVALID_ARGUMENT);
  EXPECT_ST(mrcache_invalidate(cache, buf, 0), MRCACHE_EMPTY_RANGE);
  EXPECT_ST(mrcache_invalidate(cache, (void *)(UINTPTR_MAX - 10), 100), MRCACHE_WRAPPING_RANGE);
  /* The hook pair: bad ranges open nothing; an end without its begin is E7. */
  EXPECT_ST(mrcache_release_begin(NULL, buf, 1), MRCACHE_NULL_ARGUMENT);
  EXPECT_ST(mrcache_release_end(NULL, buf, 1), MRCACHE_NULL_ARGUMENT);
  EXPECT_ST(mrcache_release_begin(cache, buf, 0), MRCACHE_EMPTY_RANGE);
  EXPECT_ST(mrcache_release_begin(cache, (void *)(UINTPTR_MAX - 10), 100), MRCACHE_WRAPPING_RANGE);
  EXPECT_ST(mrcache_release_end(cache, buf, 4096), MRCACHE_UNMATCHED_RELEASE_END);
  EXPECT_ST(mrcache_release_begin(cache, buf, 4096), MRCACHE_OK);
  EXPECT_ST(mrcache_release_end(cache, buf, 4096), MRCACHE_OK);
  EXPECT_ST(mrcache_release_end(cache, buf, 4096), MRCACHE_UNMATCHED_RELEASE_END);
  s.size = 0;
  EXPECT_ST(mrcache_stats(cache, &s), MRCACHE_INVALID_ARGUMENT);
  s.size = sizeof s;

  /* Registrar errors carry the errno. */
  c.fail_errno = 14; /* EFAULT */
  EXPECT_ST(mrcache_acquire(cache, buf, 4096, 0, &l), MRCACHE_REGISTRAR);
  mrcache_last_error(&e);
  EXPECT(e == 14);
  c.fail_errno = 0;

  /* Leases: keys, view, double release, foreign, stale, junk. */
  EXPECT_ST(mrcache_acquire(cache, buf, 65536, MRCACHE_ACCESS_LOCAL_WRITE, &l), MRCACHE_OK);
  EXPECT_ST(mrcache_lease_keys(cache, l, &lkey, &rkey), MRCACHE_OK);
  EXPECT(lkey == 1 && rkey == 7);
  EXPECT_ST(mrcache_lease_view(cache, l, &view), MRCACHE_OK);
  EXPECT(view.addr == buf && view.len == 65536 && view.access == MRCACHE_ACCESS_LOCAL_WRITE);
  EXPECT_ST(mrcache_release(other, l), MRCACHE_INVALID_LEASE);
  EXPECT_ST(mrcache_destroy(cache), MRCACHE_BUSY);
  EXPECT_ST(mrcache_release(cache, l), MRCACHE_OK);
  EXPECT_ST(mrcache_release(cache, l), MRCACHE_INVALID_LEASE);
  EXPECT_ST(mrcache_lease_view(cache, l, &view), MRCACHE_INVALID_LEASE);
  EXPECT_ST(mrcache_acquire(cache, buf, 4096, 0, &m), MRCACHE_OK);
  EXPECT_ST(mrcache_release(cache, l), MRCACHE_INVALID_LEASE); /* stale: its slot is m's now */
  mrcache_lease_t junk = { 0 };
  EXPECT_ST(mrcache_release(cache, junk), MRCACHE_INVALID_LEASE);
  junk.opaque = UINT64_MAX;
  EXPECT_ST(mrcache_release(cache, junk), MRCACHE_INVALID_LEASE);
  /* Released on another thread. */
  void *args[2] = { cache, &m };
  pthread_t t;
  void *ret;
  pthread_create(&t, NULL, release_elsewhere, args);
  pthread_join(t, &ret);
  EXPECT((mrcache_status_t)(uintptr_t)ret == MRCACHE_OK);

  /* A callback calling into its own cache gets BUSY (invalidate queues). */
  c.reenter = 1;
  EXPECT_ST(mrcache_acquire(cache, buf + (1 << 20), 4096, 0, &l), MRCACHE_OK);
  c.reenter = 0;
  EXPECT(c.reentry[0] == MRCACHE_BUSY && c.reentry[1] == MRCACHE_BUSY && c.reentry[2] == MRCACHE_BUSY);
  EXPECT(c.reentry[3] == MRCACHE_BUSY && c.reentry[4] == MRCACHE_OK);
  EXPECT_ST(mrcache_release(cache, l), MRCACHE_OK);

  /* fork: a lease held at the fork is void in the child, which can always
   * destroy its cache (it must not get MRCACHE_BUSY for good). */
  EXPECT_ST(mrcache_acquire(cache, buf, 4096, 0, &l), MRCACHE_OK);
  fflush(NULL);
  int verdict[2];
  EXPECT(pipe(verdict) == 0);
  pid_t child = fork();
  if (child == 0) {
    /* The verdict goes through a pipe, not the exit status: under valgrind
     * the child's exit reports the parent's memory as leaked. */
    mrcache_status_t st = mrcache_destroy(cache);
    if (st != MRCACHE_OK) fprintf(stderr, "child: mrcache_destroy: %s: %s\n", mrcache_status_name(st), mrcache_last_error(NULL));
    unsigned char b = (unsigned char)st;
    if (write(verdict[1], &b, 1) != 1) _exit(2);
    _exit(0);
  }
  close(verdict[1]);
  unsigned char child_st = 0xff;
  EXPECT(child > 0 && read(verdict[0], &child_st, 1) == 1 && child_st == MRCACHE_OK);
  close(verdict[0]);
  int wst = 0;
  EXPECT(waitpid(child, &wst, 0) == child);
  EXPECT_ST(mrcache_destroy(cache), MRCACHE_BUSY); /* the parent's lease still counts here */
  EXPECT_ST(mrcache_release(cache, l), MRCACHE_OK);

  /* A userfaultfd monitor that cannot start says why. ENOSYS (os error 38)
   * is what valgrind gives, which does not implement the syscall: the
   * message must name valgrind, not only the kernel. Natively
   * the monitor starts and the cache is destroyed again. */
  {
    mrcache_config_t ucfg;
    mrcache_t *u = NULL;
    EXPECT_ST(mrcache_config_init(&ucfg), MRCACHE_OK);
    ucfg.monitor = MRCACHE_MONITOR_UFFD;
    mrcache_status_t st = mrcache_create(&ucfg, &r, &u);
    if (st == MRCACHE_OK) {
      EXPECT_ST(mrcache_destroy(u), MRCACHE_OK);
    } else {
      const char *msg = mrcache_last_error(NULL);
      EXPECT(st == MRCACHE_UNSUPPORTED);
      EXPECT(strstr(msg, "os error 38") == NULL || strstr(msg, "valgrind") != NULL);
    }
  }

  EXPECT_ST(mrcache_stats(cache, &s), MRCACHE_OK);
  EXPECT(s.leases_held == 0 && s.version == MRCACHE_ABI_VERSION);
  EXPECT(strcmp(mrcache_status_name(12345), "(not an mrcache status)") == 0);
  EXPECT_ST(mrcache_destroy(cache), MRCACHE_OK);
  EXPECT_ST(mrcache_destroy(other), MRCACHE_OK);
  EXPECT(c.reg == c.dereg);
  if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
  else printf("api_errors: every check passed\n");
  return failures != 0;
}
