/* raw_children.c: children the library cannot see being made.
 *
 * glibc's fork() runs the library's atfork handlers (the child closes its
 * copy of the monitor's userfaultfd). A child made by syscall(SYS_fork),
 * syscall(SYS_clone, SIGCHLD, ...), _Fork() (glibc 2.34+, no atfork
 * handlers) or vfork() runs no handler: it holds a copy of the userfaultfd
 * for as long as it lives, which keeps the context, and every range
 * registered on it, alive. If the parent then stops its monitor (destroys
 * its last monitored cache) and releases memory that was watched, the
 * release waits for a reader that no longer exists, until the child exits.
 *
 * For each kind of child (and glibc fork, for comparison): the parent
 * caches two registrations (watched), makes the child (it sleeps 2 s with a
 * raw nanosleep and _exit(0)s: it never execs, never calls the library;
 * vfork's is made from a helper thread, which it suspends, so the main
 * thread goes on), destroys its cache, and then munmaps one registered
 * buffer and, on another thread at once, madvise(DONTNEED)s then munmaps
 * the other. Each release must
 * return within 1 s (it is timed; the child lives 2 s, so a release that
 * waits for it fails the check). The kinds run back to back, each with a
 * cache and a userfaultfd of its own, and the children are reaped at the
 * end. Then a child made by _Fork() (from a
 * parent with no monitor thread left, so it may use malloc) creates a
 * monitored cache of its own, acquires, munmaps registered memory, waits for
 * the deregistration and destroys it; while that child lives the parent
 * repeats the releases.
 *
 *   raw_children [ROUNDS]          rounds of every kind (or HANG_ITERS; default 1) */
#define _GNU_SOURCE
#include "hang_common.h"
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>

static size_t page;

/* The child: raw syscalls only (a raw fork's child has the parent's glibc
 * state, its locks included). */
static void child_body(long ns) {
  struct timespec ts = { ns / 1000000000L, ns % 1000000000L };
  syscall(SYS_nanosleep, &ts, NULL);
  syscall(SYS_exit_group, 0);
}

static pid_t vfork_pid;
static atomic_int vfork_started;
static void *vfork_thread(void *arg) {
  (void)arg;
  atomic_store(&vfork_started, 1);
  pid_t pid = vfork();
  if (pid == 0) child_body(2000000000L);
  vfork_pid = pid; /* the child has exited: vfork returns then */
  return NULL;
}

enum kind { GLIBC_FORK, SYS_FORK_K, SYS_CLONE_K, UNDERSCORE_FORK, VFORK, NKINDS };
static const char *kind_name[] = { "fork()", "syscall(SYS_fork)", "syscall(SYS_clone, SIGCHLD)", "_Fork()",
                                   "vfork() (from a helper thread)" };

/* Watched memory: a cache, two cached registrations. */
struct setup { struct hc_reg r; mrcache_t *c; char *a, *b; };

static void watch(struct setup *s) {
  memset(&s->r, 0, sizeof s->r);
  s->c = hc_create(&s->r);
  s->a = hc_map(8 * page);
  s->b = hc_map(8 * page);
  hc_touch(s->c, s->a, 8 * page);
  hc_touch(s->c, s->b, 8 * page);
}

/* Destroy the last monitored cache, then release the memory it watched:
 * a munmap on this thread and, at the same time, a madvise(DONTNEED) then a
 * munmap on another (so each is timed while the child lives). */
struct release_arg { struct setup *s; const char *who; };
static void *release_b(void *p) {
  struct release_arg *a = p;
  char what[160];
  snprintf(what, sizeof what, "madvise(DONTNEED) of formerly watched memory while a %s child lives", a->who);
  HC_TIMED(what, 1.0, madvise(a->s->b, 8 * page, MADV_DONTNEED));
  snprintf(what, sizeof what, "munmap of formerly watched memory (after a madvise) while a %s child lives", a->who);
  HC_TIMED(what, 1.0, munmap(a->s->b, 8 * page));
  return NULL;
}

static void stop_and_release(struct setup *s, const char *who) {
  char what[160];
  struct release_arg arg = { s, who };
  pthread_t t;
  EXPECT_OK(mrcache_destroy(s->c));
  hc_check_balanced(who, &s->r);
  pthread_create(&t, NULL, release_b, &arg);
  snprintf(what, sizeof what, "munmap of formerly watched memory while a %s child lives", who);
  HC_TIMED(what, 1.0, munmap(s->a, 8 * page));
  pthread_join(t, NULL);
}

static void reap(pid_t pid, const char *who) {
  int status;
  if (pid <= 0) return;
  while (waitpid(pid, &status, __WALL) < 0) {
    if (errno != EINTR) {
      perror("waitpid");
      atomic_fetch_add(&hc_failures, 1);
      return;
    }
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "%s: the %s child failed (status 0x%x)\n", hc_name, who, status);
    atomic_fetch_add(&hc_failures, 1);
  }
}

/* One kind: watch, make the child, stop and release (timed). Returns the
 * child's pid (vfork's: its helper thread is joined by reap_kind). */
static pthread_t helper;
static pid_t one_kind(enum kind k) {
  struct setup s;
  watch(&s);
  pid_t pid = -1;
  printf("raw_children: %s child; the parent stops its monitor and releases watched memory\n", kind_name[k]);
  switch (k) {
  case GLIBC_FORK: pid = fork(); break;
  case SYS_FORK_K: pid = (pid_t)syscall(SYS_fork); break;
  case SYS_CLONE_K: pid = (pid_t)syscall(SYS_clone, SIGCHLD, 0, NULL, NULL, 0); break;
  case UNDERSCORE_FORK: pid = _Fork(); break;
  case VFORK:
    vfork_pid = -1;
    atomic_store(&vfork_started, 0);
    pthread_create(&helper, NULL, vfork_thread, NULL);
    while (!atomic_load(&vfork_started)) usleep(100);
    usleep(100000); /* the helper is inside vfork: its child sleeps */
    pid = 0;
    break;
  default: break;
  }
  if (k != VFORK) {
    if (pid < 0) {
      perror(kind_name[k]);
      atomic_fetch_add(&hc_failures, 1);
      return -1;
    }
    if (pid == 0) child_body(2000000000L);
  }
  stop_and_release(&s, kind_name[k]);
  return pid;
}

static void reap_kind(enum kind k, pid_t pid) {
  if (k == VFORK) {
    pthread_join(helper, NULL);
    pid = vfork_pid;
  }
  reap(pid, kind_name[k]);
}

/* A _Fork() child that creates and uses a cache of its own. */
static void child_with_cache(void) {
  struct setup s;
  watch(&s);
  /* No cache attached in the parent while it forks: destroy, re-create
   * after. The monitor then keeps only its reader, which never allocates
   * or locks (spec.md S7.6), so the child of this otherwise single-threaded
   * parent may malloc (the library does). */
  EXPECT_OK(mrcache_destroy(s.c));
  EXPECT(munmap(s.a, 8 * page) == 0 && munmap(s.b, 8 * page) == 0);
  watch(&s);
  printf("raw_children: a _Fork() child creates and uses its own monitored cache\n");
  pid_t pid = _Fork();
  if (pid == 0) {
    alarm(10);
    atomic_store(&hc_failures, 0); /* the parent's, copied */
    static struct hc_reg cr;
    mrcache_t *c = hc_create(&cr);
    char *m = hc_map(4 * page);
    unsigned long before = atomic_load(&cr.dereg);
    hc_touch(c, m, 4 * page);
    if (munmap(m, page) != 0) _exit(2);
    while (atomic_load(&cr.dereg) == before) usleep(100);
    if (mrcache_destroy(c) != MRCACHE_OK) _exit(3);
    if (atomic_load(&cr.reg) != atomic_load(&cr.dereg)) _exit(4);
    if (atomic_load(&hc_failures)) _exit(5);
    struct timespec ts = { 2, 0 };
    nanosleep(&ts, NULL); /* lives on: the parent's releases are timed meanwhile */
    _exit(0);
  }
  EXPECT(pid > 0);
  stop_and_release(&s, "_Fork() (with a cache of its own)");
  reap(pid, "_Fork() with a cache");
}

int main(int argc, char **argv) {
  hc_init("raw_children");
  long rounds = hc_param(argc, argv, "HANG_ITERS", 1);
  page = hc_page();
  for (long i = 0; i < rounds; i++) {
    /* Every kind in turn without waiting for the children (each holds a
     * copy of its own round's userfaultfd only), then reap them all. */
    pid_t pids[NKINDS];
    for (int k = 0; k < NKINDS; k++) pids[k] = one_kind((enum kind)k);
    for (int k = 0; k < NKINDS; k++) reap_kind((enum kind)k, pids[k]);
    child_with_cache();
  }
  return hc_finish();
}
