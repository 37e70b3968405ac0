/* hang_stress.c: the hang scenarios at once, for a given time.
 *
 *  - heap threads (2): malloc 1-120 KiB, acquire (some twice), release,
 *    free, on cache H whose registrar mallocs in `reg` and frees in
 *    `dereg` (heap_traffic.c);
 *  - an unmap thread: maps 4 pages, acquires them in cache A, munmaps the
 *    first page; the monitor deregisters and A's `dereg` munmaps the other
 *    three (callback_unmaps.c) and, every few times, calls into other caches:
 *    acquires and releases in cache D (and munmaps that memory), or creates
 *    a monitored cache, uses it and destroys it (callback_other_cache.c);
 *  - a fork thread: glibc fork() children that create, use and destroy a
 *    monitored cache under alarm(5), and raw children (syscall(SYS_fork),
 *    _Fork()) that sleep 20 ms with a raw syscall and _exit (fork_during_create.c,
 *    raw_children.c).
 * Checks: every status OK, no child hung or failed, every registration of
 * every cache deregistered after the destroys.
 *
 *   hang_stress [SECONDS]          (or HANG_SECONDS; default 3) */
#define _GNU_SOURCE
#include "hang_common.h"
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>

static atomic_int stop;
static size_t page;
static mrcache_t *cache_h, *cache_a, *cache_d;
static struct hc_reg rh, ra, rd, rtmp;
static atomic_ulong heap_ops, unmaps, d_uses, tmp_caches, glibc_children, raw_children, hung, failed_children;
/* One acquire of the unmap thread: its registrations (a cache may make
 * more than one for one acquire, A7 retrying a registration an event made
 * stale) all name it; only a deregistration after the acquire returned
 * (ACQUIRED) unmaps the rest of the buffer, once. One that the cache
 * dropped during the acquire must not: the retry is registering it. */
enum { ACQUIRING, ACQUIRED, DONE };
struct token {
  atomic_int state;
};

static void *heap_thread(void *arg) {
  unsigned seed = (unsigned)(uintptr_t)arg * 7919u;
  char *keep[8] = {0};
  for (long i = 0; !atomic_load(&stop); i++) {
    size_t len = 1024 + (size_t)(rand_r(&seed) % (119 * 1024));
    char *buf = malloc(len);
    if (!buf) continue;
    memset(buf, (int)i, len);
    hc_touch(cache_h, buf, len);
    if (i % 3 == 0) hc_touch(cache_h, buf, len);
    int slot = rand_r(&seed) % 8;
    free(keep[slot]);
    keep[slot] = buf;
    atomic_fetch_add(&heap_ops, 1);
  }
  for (int s = 0; s < 8; s++) free(keep[s]);
  return NULL;
}

static void a_dereg(struct hc_reg *r, struct hc_rec *rec) {
  (void)r;
  struct token *t = rec->owner;
  int acquired = ACQUIRED;
  if (!t || !atomic_compare_exchange_strong(&t->state, &acquired, DONE)) return;
  free(t);
  /* The unmap thread unmapped the first page; the rest is the callback's. */
  EXPECT(munmap((char *)rec->addr + page, rec->len - page) == 0);
  unsigned long n = atomic_fetch_add(&unmaps, 1);
  if (n % 4 == 1) {
    char *m = hc_map(2 * page);
    hc_touch(cache_d, m, 2 * page);
    EXPECT(munmap(m, 2 * page) == 0);
    atomic_fetch_add(&d_uses, 1);
  } else if (n % 8 == 3) {
    mrcache_config_t cfg;
    mrcache_registrar_t reg = hc_registrar(&rtmp);
    mrcache_t *c = NULL;
    mrcache_config_init(&cfg);
    cfg.monitor = MRCACHE_MONITOR_UFFD;
    EXPECT_OK(mrcache_create(&cfg, &reg, &c));
    if (c) {
      char *m = hc_map(2 * page);
      hc_touch(c, m, 2 * page);
      EXPECT_OK(mrcache_destroy(c));
      EXPECT(munmap(m, 2 * page) == 0);
      atomic_fetch_add(&tmp_caches, 1);
    }
  }
}

static void *unmap_thread(void *arg) {
  (void)arg;
  while (!atomic_load(&stop)) {
    char *buf = hc_map(4 * page);
    struct token *t = malloc(sizeof *t);
    if (!t) abort();
    atomic_init(&t->state, ACQUIRING);
    hc_next_owner = t;
    mrcache_lease_t l;
    mrcache_status_t st = mrcache_acquire(cache_a, buf, 4 * page, MRCACHE_ACCESS_LOCAL_WRITE, &l);
    hc_next_owner = NULL;
    EXPECT_ST(st, MRCACHE_OK);
    if (st != MRCACHE_OK) {
      free(t); /* no registration of it remains */
    } else {
      atomic_store(&t->state, ACQUIRED);
      EXPECT_OK(mrcache_release(cache_a, l));
    }
    EXPECT(munmap(buf, page) == 0);
    usleep(500);
  }
  return NULL;
}

static void raw_child(void) {
  struct timespec ts = { 0, 20000000L };
  syscall(SYS_nanosleep, &ts, NULL);
  syscall(SYS_exit_group, 0);
}

static void *fork_thread(void *arg) {
  (void)arg;
  for (long i = 0; !atomic_load(&stop); i++) {
    pid_t pid;
    int kind = (int)(i % 3);
    if (kind == 0) {
      pid = fork();
      if (pid == 0) {
        alarm(5);
        atomic_store(&hc_failures, 0);
        hc_name = "hang_stress (child)";
        static struct hc_reg cr;
        mrcache_t *c = hc_create(&cr);
        char *m = hc_map(4 * page);
        unsigned long before = atomic_load(&cr.dereg);
        hc_touch(c, m, 4 * page);
        EXPECT(munmap(m, page) == 0);
        while (atomic_load(&cr.dereg) == before) usleep(100);
        EXPECT_OK(mrcache_destroy(c));
        hc_check_balanced("the child's cache", &cr);
        _exit(atomic_load(&hc_failures) ? 1 : 0);
      }
      atomic_fetch_add(&glibc_children, 1);
    } else {
      pid = kind == 1 ? (pid_t)syscall(SYS_fork) : _Fork();
      if (pid == 0) raw_child();
      atomic_fetch_add(&raw_children, 1);
    }
    if (pid < 0) {
      perror("fork");
      atomic_fetch_add(&failed_children, 1);
      continue;
    }
    int status;
    while (waitpid(pid, &status, 0) < 0) {}
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) {
      fprintf(stderr, "hang_stress: child %d HUNG: killed by its alarm after 5 s\n", pid);
      atomic_fetch_add(&hung, 1);
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "hang_stress: child %d failed (status 0x%x)\n", pid, status);
      atomic_fetch_add(&failed_children, 1);
    }
    usleep(5000);
  }
  return NULL;
}

int main(int argc, char **argv) {
  hc_init("hang_stress");
  long seconds = hc_param(argc, argv, "HANG_SECONDS", 3);
  page = hc_page();
  ra.on_dereg = a_dereg;
  cache_h = hc_create(&rh);
  cache_a = hc_create(&ra);
  cache_d = hc_create(&rd);
  printf("hang_stress: %ld s of heap traffic, unmapping callbacks into other caches, glibc and raw forks\n",
         seconds);
  pthread_t t[4];
  pthread_create(&t[0], NULL, heap_thread, (void *)1);
  pthread_create(&t[1], NULL, heap_thread, (void *)2);
  pthread_create(&t[2], NULL, unmap_thread, NULL);
  pthread_create(&t[3], NULL, fork_thread, NULL);
  double end = hc_now() + (double)seconds;
  while (hc_now() < end) usleep(20000);
  atomic_store(&stop, 1);
  for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
  EXPECT_OK(mrcache_destroy(cache_a)); /* its callbacks use D: first */
  EXPECT_OK(mrcache_destroy(cache_d));
  EXPECT_OK(mrcache_destroy(cache_h));
  hc_check_balanced("H", &rh);
  hc_check_balanced("A", &ra);
  hc_check_balanced("D", &rd);
  hc_check_balanced("the callbacks' own caches", &rtmp);
  printf("hang_stress: %lu heap ops, %lu callback unmaps, %lu uses of D and %lu caches made in callbacks, "
         "%lu glibc and %lu raw children (%lu hung, %lu failed)\n",
         atomic_load(&heap_ops), atomic_load(&unmaps), atomic_load(&d_uses), atomic_load(&tmp_caches),
         atomic_load(&glibc_children), atomic_load(&raw_children), atomic_load(&hung),
         atomic_load(&failed_children));
  EXPECT(atomic_load(&hung) == 0 && atomic_load(&failed_children) == 0);
  return hc_finish();
}
