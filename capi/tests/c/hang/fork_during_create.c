/* fork_during_create.c: glibc fork() while other threads create and destroy
 * monitored caches (and acquire, release and munmap registered memory in
 * them).
 *
 * A fork can catch the library anywhere: a monitor starting or stopping, its
 * userfaultfd being opened or closed, a lock of the process's monitor held.
 * The child must be able to create a monitored cache of its own, use it and
 * destroy it; the parent's threads must keep going.
 *
 * Threads (HANG_THREADS, default 3) loop: create a monitored cache, map 4
 * pages, acquire and release them, munmap one page (the monitor invalidates
 * the registration), acquire the rest again, destroy, munmap the rest. The
 * main thread forks repeatedly; each child, under its own alarm(5) (a hung
 * child dies of SIGALRM and is reported, not waited for forever), creates a
 * monitored cache, acquires, munmaps registered memory, waits for the
 * deregistration, destroys the cache and _exit(0)s. The parent waits for
 * every child.
 *
 *   fork_during_create [FORKS]     (or HANG_ITERS; default 40) */
#define _GNU_SOURCE
#include "hang_common.h"
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

static atomic_int stop;
static atomic_ulong cycles;
static size_t page;

static void one_cycle(struct hc_reg *r, int wait_dereg) {
  mrcache_t *c = hc_create(r);
  char *buf = hc_map(4 * page);
  unsigned long before = atomic_load(&r->dereg);
  hc_touch(c, buf, 4 * page);
  EXPECT(munmap(buf, page) == 0);
  if (wait_dereg)
    while (atomic_load(&r->dereg) == before) usleep(100);
  hc_touch(c, buf + page, 3 * page);
  EXPECT_OK(mrcache_destroy(c));
  EXPECT(munmap(buf + page, 3 * page) == 0);
}

static void *churn(void *arg) {
  struct hc_reg *r = arg;
  while (!atomic_load(&stop)) {
    one_cycle(r, 0);
    atomic_fetch_add(&cycles, 1);
  }
  return NULL;
}

int main(int argc, char **argv) {
  hc_init("fork_during_create");
  long forks = hc_param(argc, argv, "HANG_ITERS", 40);
  int nthreads = (int)hc_env("HANG_THREADS", 3);
  page = hc_page();
  /* The monitor is there at all (else skip before forking). */
  static struct hc_reg probe;
  EXPECT_OK(mrcache_destroy(hc_create(&probe)));
  static struct hc_reg regs[16];
  pthread_t t[16];
  if (nthreads > 16) nthreads = 16;
  printf("fork_during_create: %d threads create/use/destroy monitored caches; %ld glibc forks\n", nthreads, forks);
  for (int i = 0; i < nthreads; i++) pthread_create(&t[i], NULL, churn, &regs[i]);
  int hung = 0, failed = 0;
  for (long i = 0; i < forks; i++) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      failed++;
      break;
    }
    if (pid == 0) {
      alarm(5);
      atomic_store(&hc_failures, 0); /* the parent's, copied */
      hc_name = "fork_during_create (child)";
      static struct hc_reg child_reg;
      one_cycle(&child_reg, 1);
      hc_check_balanced("the child's cache", &child_reg);
      _exit(atomic_load(&hc_failures) ? 1 : 0);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0) {}
    if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) {
      fprintf(stderr, "fork_during_create: child %d (fork %ld) HUNG: killed by its alarm after 5 s\n", pid, i);
      hung++;
      if (hung >= 2) break; /* enough: each costs the alarm's 5 s */
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "fork_during_create: child %d (fork %ld) failed: %s %d\n", pid, i,
              WIFEXITED(status) ? "exit" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
      failed++;
    }
    usleep(1000 * (unsigned)(i % 5));
  }
  atomic_store(&stop, 1);
  for (int i = 0; i < nthreads; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < nthreads; i++) hc_check_balanced("a thread's caches", &regs[i]);
  printf("fork_during_create: %ld forks (%d children hung, %d failed), %lu create/destroy cycles in the parent\n",
         forks, hung, failed, atomic_load(&cycles));
  EXPECT(hung == 0 && failed == 0);
  return hc_finish();
}
