/* cancel_in_reg.c: pthread_cancel of a thread while the library runs its
 * `reg` callback, blocked at a cancellation point.
 *
 * glibc acts on a cancellation by a forced unwind, which would run through
 * the library's frames; unwinding out of it aborts the process ("FATAL:
 * exception not rethrown"). The fix disables cancellation while the
 * library runs a callback: the cancel then acts at the thread's next
 * cancellation point after mrcache_acquire returns. The test accepts that
 * ("completed, then cancelled") and also "abandoned" (the cancellation ran
 * out of the acquire, which left nothing behind), as long as nothing aborts,
 * nothing leaks and the thread is cancelled in the end:
 *  - a thread calls mrcache_acquire; `reg` signals it is in, then blocks:
 *    (1) in read() on a pipe, (2) in usleep() until a flag is set;
 *  - the main thread pthread_cancel()s it, waits 100 ms, unblocks `reg`
 *    (writes the pipe / sets the flag: with cancellation disabled, `reg`
 *    still has to return) and joins it: it must be PTHREAD_CANCELED. A
 *    cleanup handler releases the lease if the thread still holds it;
 *  - then: no lease held, mrcache_destroy returns OK, and the registrar's
 *    own counters balance (a registration `reg` never finished is not
 *    counted).
 * (3) HANG_CANCEL_EXIT=1 (instead of (1) and (2)): `reg` calls
 *    pthread_exit(): the library stops the exit where it called `reg`,
 *    finishes the acquire as after a failed `reg`, and the exit goes on from
 *    mrcache_acquire (spec.md S7.8): the thread ends with its value (NULL),
 *    the acquire does not return, and the cache is consistent
 *    (callback_escapes.c checks this and the other ways out at length).
 *
 *   cancel_in_reg [ROUNDS]         rounds of (1) and (2) each (or HANG_ITERS; default 5)
 *   HANG_CANCEL_EMULATE_FIX=1      `reg` disables cancellation around its
 *                                  wait itself (what the fix does around
 *                                  callbacks): the test must then pass on
 *                                  any library; a check of the test. */
#define _GNU_SOURCE
#include "hang_common.h"
#include <fcntl.h>
#include <pthread.h>

enum { BLOCK_NONE, BLOCK_READ, BLOCK_SLEEP, BLOCK_EXIT };
static atomic_int block_mode, in_reg, unblock;
static int pipefd[2];
/* HANG_CANCEL_EMULATE_FIX=1: the callback disables cancellation itself, as
 * the fixed library will around it (a check of this test on today's
 * library: it must then pass). */
static int emulate_fix;

static int blocking_reg(struct hc_reg *r, void *addr, size_t len) {
  (void)r; (void)addr; (void)len;
  int mode = atomic_exchange(&block_mode, BLOCK_NONE);
  if (mode == BLOCK_NONE) return 0;
  atomic_store(&in_reg, 1);
  int old = 0;
  if (emulate_fix) pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
  if (mode == BLOCK_READ) {
    char c;
    while (read(pipefd[0], &c, 1) < 0 && errno == EINTR) {}
  } else if (mode == BLOCK_SLEEP) {
    while (!atomic_load(&unblock)) usleep(1000);
  } else if (mode == BLOCK_EXIT) {
    pthread_exit(NULL);
  }
  if (emulate_fix) pthread_setcancelstate(old, NULL);
  return 0;
}

struct targ {
  mrcache_t *c;
  char *buf;
  size_t len;
  mrcache_lease_t lease;
  int held, returned;
  mrcache_status_t st;
};

static void release_held(void *p) {
  struct targ *a = p;
  if (a->held) {
    EXPECT_OK(mrcache_release(a->c, a->lease));
    a->held = 0;
  }
}

static void *acquirer(void *p) {
  struct targ *a = p;
  void *ret = (void *)1;
  pthread_cleanup_push(release_held, a);
  mrcache_lease_t l;
  a->st = mrcache_acquire(a->c, a->buf, a->len, MRCACHE_ACCESS_LOCAL_WRITE, &l);
  a->returned = 1;
  if (a->st == MRCACHE_OK) {
    a->lease = l;
    a->held = 1;
  }
  pthread_testcancel(); /* the pending cancel acts here (with the lease held) */
  pthread_cleanup_pop(1);
  return ret;
}

static const char *mode_name(int m) {
  return m == BLOCK_READ ? "read() on a pipe" : m == BLOCK_SLEEP ? "usleep()" : "pthread_exit()";
}

static void one_round(int mode, long round) {
  static struct hc_reg r = { .on_reg = blocking_reg };
  memset(&r, 0, sizeof r);
  r.on_reg = blocking_reg;
  mrcache_t *c = hc_create(&r);
  size_t page = hc_page();
  struct targ a = { .c = c, .buf = hc_map(4 * page), .len = 4 * page };
  if (pipe(pipefd) != 0) {
    perror("pipe");
    exit(1);
  }
  atomic_store(&in_reg, 0);
  atomic_store(&unblock, 0);
  atomic_store(&block_mode, mode);
  pthread_t t;
  pthread_create(&t, NULL, acquirer, &a);
  while (!atomic_load(&in_reg)) usleep(100);
  usleep(10000); /* in the cancellation point */
  EXPECT(pthread_cancel(t) == 0);
  usleep(100000);
  /* With cancellation disabled in the callback, reg is still blocked: let it return. */
  atomic_store(&unblock, 1);
  EXPECT(write(pipefd[1], "x", 1) == 1);
  void *ret;
  EXPECT(pthread_join(t, &ret) == 0);
  const char *outcome = ret != PTHREAD_CANCELED ? "NOT cancelled"
                        : a.returned            ? "acquire completed, then cancelled"
                                                : "acquire abandoned by the cancellation";
  if (round == 0 || ret != PTHREAD_CANCELED)
    printf("cancel_in_reg: reg blocked in %s: %s (acquire %s)\n", mode_name(mode), outcome,
           a.returned ? mrcache_status_name(a.st) : "did not return");
  if (mode != BLOCK_EXIT) {
    EXPECT(ret == PTHREAD_CANCELED); /* a pending cancel is never lost */
    if (a.returned) EXPECT_ST(a.st, MRCACHE_OK);
  } else {
    EXPECT(ret == NULL && !a.returned);
  }
  mrcache_stats_t s = { .size = sizeof s };
  EXPECT_OK(mrcache_stats(c, &s));
  EXPECT(s.leases_held == 0);
  /* The cache still works on another thread, and destroy returns. */
  char *other = hc_map(4 * page);
  hc_touch(c, other, 4 * page);
  mrcache_status_t st = mrcache_destroy(c);
  EXPECT_ST(st, MRCACHE_OK);
  hc_check_balanced(mode_name(mode), &r);
  close(pipefd[0]);
  close(pipefd[1]);
  munmap(a.buf, 4 * page);
  munmap(other, 4 * page);
}

int main(int argc, char **argv) {
  hc_init("cancel_in_reg");
  long rounds = hc_param(argc, argv, "HANG_ITERS", 5);
  emulate_fix = hc_env("HANG_CANCEL_EMULATE_FIX", 0) == 1;
  if (emulate_fix) printf("cancel_in_reg: HANG_CANCEL_EMULATE_FIX=1: reg disables cancellation itself\n");
  if (hc_env("HANG_CANCEL_EXIT", 0) == 1) {
    printf("cancel_in_reg: HANG_CANCEL_EXIT=1: only pthread_exit() inside reg\n");
    one_round(BLOCK_EXIT, 0);
    return hc_finish();
  }
  for (long i = 0; i < rounds; i++) one_round(BLOCK_READ, i);
  for (long i = 0; i < rounds; i++) one_round(BLOCK_SLEEP, i);
  return hc_finish();
}
