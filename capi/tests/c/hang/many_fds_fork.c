/* many_fds_fork.c: monitors stopping while others start, on several
 * threads, across glibc forks.
 *
 * Every monitored cache of a process shares one monitor. In an older
 * design the last detach stopped it and closed its userfaultfd, and the
 * next cache opened a new one: a fork could catch several, a child's copy
 * kept that context (and every range registered on it) alive after the
 * parent's reader stopped, and the parent's release of such a range waited
 * for the child (that design tracked at most 4 fds at a fork). Now the
 * monitor's one fd and its reader live as long as the process (spec.md
 * S7.6): a child's copy is harmless, and what this test checks is the
 * property itself: every release in the parent returns within the limit
 * while children live, and each child can create, use and destroy a cache
 * of its own. The copies a child holds are reported.
 *
 * Threads (HANG_THREADS, default 6) loop: create a monitored cache, acquire
 * and release 4 pages, munmap one page (timed), destroy, munmap the rest
 * (timed: at most 1 s each). The main thread forks (glibc fork()) with up
 * to 8 children alive at once; each child counts the userfaultfds it holds
 * (/proc/self/fd, reported), creates, uses and destroys a monitored cache
 * of its own under alarm(5), and lives 1.5 s, longer than the time limit of
 * the parent's releases.
 *
 *   many_fds_fork [FORKS]          (or HANG_ITERS; default 16) */
#define _GNU_SOURCE
#include "hang_common.h"
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

static atomic_int stop;
static atomic_ulong cycles;
static size_t page;

static int count_uffds(int report) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  char path[300], link[128];
  int n = 0;
  if (!d) return -1;
  while ((e = readdir(d))) {
    snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    ssize_t k = readlink(path, link, sizeof link - 1);
    if (k <= 0) continue;
    link[k] = 0;
    if (strstr(link, "userfaultfd")) {
      if (report) fprintf(stderr, "many_fds_fork (child): fd %s -> %s\n", e->d_name, link);
      n++;
    }
  }
  closedir(d);
  return n;
}

static void cycle(struct hc_reg *r, double limit) {
  mrcache_t *c = hc_create(r);
  char *buf = hc_map(4 * page);
  hc_touch(c, buf, 4 * page);
  HC_TIMED("munmap of a watched page", limit, munmap(buf, page));
  EXPECT_OK(mrcache_destroy(c));
  HC_TIMED("munmap after the cache's destroy", limit, munmap(buf + page, 3 * page));
}

static void *churn(void *arg) {
  struct hc_reg *r = arg;
  unsigned seed = (unsigned)(uintptr_t)arg;
  while (!atomic_load(&stop)) {
    cycle(r, 1.0);
    atomic_fetch_add(&cycles, 1);
    usleep((unsigned)(rand_r(&seed) % 500));
  }
  return NULL;
}

static void child(void) {
  double t0 = hc_now();
  alarm(5);
  atomic_store(&hc_failures, 0); /* the parent's, copied */
  hc_name = "many_fds_fork (child)";
  int n = count_uffds(0);
  if (n != 0) printf("%s: the child holds %d userfaultfd(s) of the parent (harmless: the parent's reader never stops)\n", hc_name, n);
  static struct hc_reg r;
  cycle(&r, 1.0);
  hc_check_balanced("the child's cache", &r);
  /* Live on: a parent release that waits for this child's copy fails its
   * time limit. */
  while (hc_now() - t0 < 1.5) usleep(10000);
  _exit(atomic_load(&hc_failures) ? 1 : 0);
}

static int failed_children, hung_children;
static void reap(pid_t pid, int flags, int *alive) {
  int status;
  pid_t p = waitpid(pid, &status, flags);
  if (p <= 0) return;
  (*alive)--;
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) {
    fprintf(stderr, "many_fds_fork: child %d HUNG: killed by its alarm after 5 s\n", p);
    hung_children++;
  } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "many_fds_fork: child %d failed (status 0x%x)\n", p, status);
    failed_children++;
  }
}

int main(int argc, char **argv) {
  hc_init("many_fds_fork");
  long forks = hc_param(argc, argv, "HANG_ITERS", 16);
  int nthreads = (int)hc_env("HANG_THREADS", 6);
  page = hc_page();
  static struct hc_reg probe;
  EXPECT_OK(mrcache_destroy(hc_create(&probe)));
  static struct hc_reg regs[32];
  pthread_t t[32];
  if (nthreads > 32) nthreads = 32;
  printf("many_fds_fork: %d threads start and stop monitored caches; %ld glibc forks\n", nthreads, forks);
  for (int i = 0; i < nthreads; i++) pthread_create(&t[i], NULL, churn, &regs[i]);
  int alive = 0;
  for (long i = 0; i < forks; i++) {
    while (alive >= 8) reap(-1, 0, &alive);
    usleep(20000);
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      failed_children++;
      break;
    }
    if (pid == 0) child();
    alive++;
    reap(-1, WNOHANG, &alive);
  }
  while (alive > 0) reap(-1, 0, &alive);
  atomic_store(&stop, 1);
  for (int i = 0; i < nthreads; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < nthreads; i++) hc_check_balanced("a thread's caches", &regs[i]);
  printf("many_fds_fork: %ld forks (%d children hung, %d failed), %lu start/stop cycles in the parent\n", forks,
         hung_children, failed_children, atomic_load(&cycles));
  EXPECT(hung_children == 0 && failed_children == 0);
  return hc_finish();
}
