/* callback_escapes.c: callbacks that end other than by returning
 * (spec.md S7.8, the header's "Callbacks"). Each case runs a few times; the
 * process must not abort or hang (the watchdog), the cache must stay
 * consistent (destroy returns OK, no lease is left, every registration the
 * registrar finished is deregistered once) and the thread must end as the
 * callback asked:
 *  1. `reg` calls pthread_exit(value) inside a pthread_cleanup_push region
 *     of the acquiring thread: the acquire does not return, the thread's
 *     cleanup handler runs, pthread_join gives `value`.
 *  2. `dereg` calls pthread_exit during mrcache_flush on an application
 *     thread: the thread exits with its value; the handle counts as gone.
 *  3. `reg` re-enables cancellation and blocks at a cancellation point; the
 *     thread is cancelled: pthread_join gives PTHREAD_CANCELED.
 *  4. `reg` longjmps out (forbidden by the header; glibc's longjmp lets the
 *     library repair the thread): afterwards the same thread can acquire
 *     on the same cache (not MRCACHE_BUSY), its cancel state is its own
 *     again, and a later pthread_exit in it runs its own cleanup handlers
 *     (the library's landing buffer is not left behind).
 *  5. Nested: `reg` of cache A acquires on cache B, whose `reg` calls
 *     pthread_exit: the thread exits with B's value, through A's call, and
 *     both caches stay consistent.
 *  6. The monitor's service thread: a `dereg` it runs (after a munmap of a
 *     cached range) calls pthread_exit (the test's registrar tells the
 *     thread by its name, mrcache-svc). The exit is dropped there: later
 *     munmaps still return and the cache still deregisters on that thread.
 *
 *  7. The cancel state callbacks run with: an evicting miss runs `reg` and
 *     then the victim's `dereg` in one mrcache_acquire; both find
 *     cancellation disabled, and the thread's state after the call is the
 *     one before it (enabled; or disabled, when the caller had disabled
 *     it). The library disables it once per miss, not once per callback.
 *
 *   callback_escapes [ROUNDS]   rounds of each case (or HANG_ITERS; default 3) */
#define _GNU_SOURCE
#include "hang_common.h"
#include <pthread.h>
#include <setjmp.h>

enum { ESC_NONE, ESC_EXIT, ESC_CANCEL, ESC_LONGJMP, ESC_NESTED };
static _Thread_local int reg_escape;   /* what this thread's next reg does */
static _Thread_local int dereg_escape; /* what this thread's next dereg does */
static _Thread_local jmp_buf reg_jump;
static atomic_int service_exit;        /* the next dereg on the service thread exits */
static atomic_ulong exits_in_dereg;    /* deregs that exited (their record is not freed) */
static atomic_int in_cancel_reg;      /* case 3: reg is about to block */
static mrcache_t *nested_b;            /* case 5: the cache `reg` of A acquires on */
static char *nested_buf;

#define EXIT_VALUE ((void *)0x5eed)

static int escaping_reg(struct hc_reg *r, void *addr, size_t len) {
  (void)r; (void)addr; (void)len;
  int what = reg_escape;
  reg_escape = ESC_NONE;
  switch (what) {
  case ESC_EXIT:
    pthread_exit(EXIT_VALUE);
  case ESC_CANCEL: {
    pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
    atomic_store(&in_cancel_reg, 1);
    for (;;) pause(); /* a cancellation point; the main thread cancels */
  }
  case ESC_LONGJMP:
    longjmp(reg_jump, 1);
  case ESC_NESTED: {
    mrcache_lease_t l;
    reg_escape = ESC_EXIT; /* B's reg, on this thread */
    mrcache_acquire(nested_b, nested_buf, hc_page(), MRCACHE_ACCESS_LOCAL_WRITE, &l);
    fprintf(stderr, "callback_escapes: nested acquire returned\n");
    atomic_fetch_add(&hc_failures, 1);
    return 5;
  }
  }
  return 0;
}

static void escaping_dereg(struct hc_reg *r, struct hc_rec *rec) {
  (void)r; (void)rec;
  /* Case 6 acts only on the service thread: a drain on an application
   * thread (mrcache_stats drains too) may also run the dereg. */
  char name[16] = "";
  pthread_getname_np(pthread_self(), name, sizeof name);
  int service = strcmp(name, "mrcache-svc") == 0 && atomic_exchange(&service_exit, 0);
  int what = dereg_escape;
  dereg_escape = ESC_NONE;
  if (service || what == ESC_EXIT) {
    atomic_fetch_add(&exits_in_dereg, 1);
    pthread_exit(EXIT_VALUE);
  }
}

static struct hc_reg reg_a = { .on_reg = escaping_reg, .on_dereg = escaping_dereg };
static struct hc_reg reg_b = { .on_reg = escaping_reg, .on_dereg = escaping_dereg };

struct job {
  mrcache_t *c;
  char *buf;
  size_t len;
  int cleanup_ran;
  int returned;
};

static void mark_cleanup(void *p) { ((struct job *)p)->cleanup_ran = 1; }

/* Case 1 and 5: acquire with an exiting reg, inside the thread's own cleanup region. */
static void *acquire_exits(void *p) {
  struct job *j = p;
  pthread_cleanup_push(mark_cleanup, j);
  mrcache_lease_t l;
  mrcache_acquire(j->c, j->buf, j->len, MRCACHE_ACCESS_LOCAL_WRITE, &l);
  j->returned = 1;
  pthread_cleanup_pop(0);
  return NULL;
}

static void *acquire_then_flush_exits(void *p) {
  struct job *j = p;
  hc_touch(j->c, j->buf, j->len); /* cached, unleased */
  pthread_cleanup_push(mark_cleanup, j);
  dereg_escape = ESC_EXIT;
  mrcache_flush(j->c);
  j->returned = 1;
  pthread_cleanup_pop(0);
  return NULL;
}

static void *acquire_cancelled(void *p) {
  struct job *j = p;
  mrcache_lease_t l;
  reg_escape = ESC_CANCEL;
  mrcache_acquire(j->c, j->buf, j->len, MRCACHE_ACCESS_LOCAL_WRITE, &l);
  j->returned = 1;
  return NULL;
}

static void *acquire_longjmps(void *p) {
  struct job *j = p;
  mrcache_lease_t l;
  if (setjmp(reg_jump) == 0) {
    reg_escape = ESC_LONGJMP;
    mrcache_acquire(j->c, j->buf, j->len, MRCACHE_ACCESS_LOCAL_WRITE, &l);
    fprintf(stderr, "callback_escapes: acquire returned although reg longjmp'd\n");
    atomic_fetch_add(&hc_failures, 1);
  }
  /* The same thread, the same cache: not MRCACHE_BUSY, and it caches. */
  hc_touch(j->c, j->buf + hc_page(), hc_page());
  int old = -1;
  pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, &old);
  EXPECT(old == PTHREAD_CANCEL_ENABLE); /* the library's disable did not stay */
  /* A later exit lands in this thread's own handler, not in the skipped frame. */
  pthread_cleanup_push(mark_cleanup, j);
  pthread_exit(EXIT_VALUE);
  pthread_cleanup_pop(0);
  return NULL;
}

static void *run(void *(*fn)(void *), struct job *j) {
  pthread_t t;
  void *ret = NULL;
  EXPECT(pthread_create(&t, NULL, fn, j) == 0);
  EXPECT(pthread_join(t, &ret) == 0);
  return ret;
}

static void check_destroy(const char *what, mrcache_t *c, struct hc_reg *r) {
  mrcache_stats_t s = { .size = sizeof s };
  EXPECT_OK(mrcache_stats(c, &s));
  EXPECT(s.leases_held == 0);
  EXPECT_OK(mrcache_destroy(c));
  /* A dereg that exited did not free its record (the test's registrar). */
  unsigned long reg = atomic_load(&r->reg), dereg = atomic_load(&r->dereg) + atomic_exchange(&exits_in_dereg, 0);
  if (reg != dereg || atomic_load(&r->bad_handles)) {
    fprintf(stderr, "callback_escapes: %s: %lu registrations, %lu deregistrations (exits included)\n", what, reg,
            dereg);
    atomic_fetch_add(&hc_failures, 1);
  }
}

static void reset(struct hc_reg *r) {
  atomic_store(&r->reg, 0);
  atomic_store(&r->dereg, 0);
  atomic_store(&r->bad_handles, 0);
}

/* Case 1 wrapper: sets this thread's reg escape, then acquires. */
static void *exit_in_reg(void *p) {
  reg_escape = ESC_EXIT;
  return acquire_exits(p);
}

/* Case 5 wrapper: A's reg acquires on B, whose reg exits. */
static void *exit_in_nested_reg(void *p) {
  reg_escape = ESC_NESTED;
  return acquire_exits(p);
}

//= spec.md#S7.8
//# the exit goes on from the entry point, through the caller's cleanup
//# handlers, with the value the callback passed
static void case_exit_in_reg(void) {
  size_t page = hc_page();
  reset(&reg_a);
  mrcache_t *a = hc_create(&reg_a);
  char *buf = hc_map(8 * page);
  hc_touch(a, buf + 4 * page, page);
  struct job j = { .c = a, .buf = buf, .len = page };
  void *ret = run(exit_in_reg, &j);
  EXPECT(ret == EXIT_VALUE);
  EXPECT(j.cleanup_ran && !j.returned);
  hc_touch(a, buf, page); /* the abandoned range registers afresh */
  check_destroy("pthread_exit in reg", a, &reg_a);
  munmap(buf, 8 * page);
}

static void case_exit_in_dereg(void) {
  size_t page = hc_page();
  reset(&reg_a);
  mrcache_t *a = hc_create(&reg_a);
  char *buf = hc_map(8 * page);
  struct job j = { .c = a, .buf = buf, .len = page };
  void *ret = run(acquire_then_flush_exits, &j);
  EXPECT(ret == EXIT_VALUE);
  EXPECT(j.cleanup_ran && !j.returned);
  mrcache_stats_t s = { .size = sizeof s };
  EXPECT_OK(mrcache_stats(a, &s));
  EXPECT(s.cached_entries == 0); /* the flush completed its removal */
  hc_touch(a, buf, page);
  check_destroy("pthread_exit in dereg", a, &reg_a);
  munmap(buf, 8 * page);
}

static void case_cancel_in_reg(void) {
  size_t page = hc_page();
  reset(&reg_a);
  mrcache_t *a = hc_create(&reg_a);
  char *buf = hc_map(8 * page);
  struct job j = { .c = a, .buf = buf, .len = page };
  pthread_t t;
  void *ret = NULL;
  atomic_store(&in_cancel_reg, 0);
  EXPECT(pthread_create(&t, NULL, acquire_cancelled, &j) == 0);
  while (!atomic_load(&in_cancel_reg)) usleep(100);
  EXPECT(pthread_cancel(t) == 0);
  EXPECT(pthread_join(t, &ret) == 0);
  EXPECT(ret == PTHREAD_CANCELED);
  EXPECT(!j.returned);
  hc_touch(a, buf, page);
  check_destroy("cancel re-enabled in reg", a, &reg_a);
  munmap(buf, 8 * page);
}

static void case_longjmp_in_reg(void) {
  size_t page = hc_page();
  reset(&reg_a);
  mrcache_t *a = hc_create(&reg_a);
  char *buf = hc_map(8 * page);
  struct job j = { .c = a, .buf = buf, .len = page };
  void *ret = run(acquire_longjmps, &j);
  EXPECT(ret == EXIT_VALUE);
  EXPECT(j.cleanup_ran);
  check_destroy("longjmp out of reg", a, &reg_a);
  munmap(buf, 8 * page);
}

static void case_nested_exit(void) {
  size_t page = hc_page();
  reset(&reg_a);
  reset(&reg_b);
  mrcache_t *a = hc_create(&reg_a);
  nested_b = hc_create(&reg_b);
  char *buf = hc_map(8 * page);
  nested_buf = hc_map(page);
  struct job j = { .c = a, .buf = buf, .len = page };
  void *ret = run(exit_in_nested_reg, &j);
  EXPECT(ret == EXIT_VALUE);
  EXPECT(j.cleanup_ran && !j.returned);
  hc_touch(a, buf, page);
  hc_touch(nested_b, nested_buf, page);
  check_destroy("nested: B's reg exits inside A's", nested_b, &reg_b);
  check_destroy("nested: A", a, &reg_a);
  munmap(buf, 8 * page);
  munmap(nested_buf, page);
}

static void case_service_thread_exit(void) {
  size_t page = hc_page();
  reset(&reg_a);
  mrcache_t *a = hc_create(&reg_a);
  for (int i = 0; i < 3; i++) {
    char *buf = hc_map(4 * page);
    hc_touch(a, buf, 4 * page); /* cached, unleased */
    if (i == 0) atomic_store(&service_exit, 1);
    HC_TIMED("munmap of a cached range", 5.0, munmap(buf, 4 * page));
  }
  /* The service thread deregisters all three (one of them exits there).
   * No library call meanwhile: it could drain on this thread instead. */
  for (int spin = 0; spin < 5000; spin++) {
    if (atomic_load(&reg_a.dereg) + atomic_load(&exits_in_dereg) == 3) break;
    usleep(1000);
  }
  mrcache_stats_t s = { .size = sizeof s };
  EXPECT_OK(mrcache_stats(a, &s));
  EXPECT(s.cached_entries == 0);
  EXPECT(atomic_load(&service_exit) == 0); /* the exiting dereg ran */
  check_destroy("pthread_exit in dereg on the service thread", a, &reg_a);
}

/* Case 7: the state each callback found (PTHREAD_CANCEL_*), -1 if none ran. */
static _Thread_local int state_in_reg = -1, state_in_dereg = -1;

static int cancel_state_now(void) {
  int old;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
  pthread_setcancelstate(old, NULL);
  return old;
}

static int recording_reg(struct hc_reg *r, void *addr, size_t len) {
  (void)r; (void)addr; (void)len;
  state_in_reg = cancel_state_now();
  return 0;
}

static void recording_dereg(struct hc_reg *r, struct hc_rec *rec) {
  (void)r; (void)rec;
  state_in_dereg = cancel_state_now();
}

static struct hc_reg reg_state = { .on_reg = recording_reg, .on_dereg = recording_dereg };

static void *evicting_misses(void *p) {
  struct job *j = p;
  size_t page = hc_page();
  for (int disabled = 0; disabled < 2; disabled++) {
    int before = disabled ? PTHREAD_CANCEL_DISABLE : PTHREAD_CANCEL_ENABLE;
    pthread_setcancelstate(before, NULL);
    for (int i = 0; i < 4; i++) {
      mrcache_lease_t l;
      state_in_reg = state_in_dereg = -1;
      /* One entry at most: from the second miss on, each evicts the last. */
      EXPECT_OK(mrcache_acquire(j->c, j->buf + (size_t)(2 * i) * page, page, MRCACHE_ACCESS_LOCAL_WRITE, &l));
      EXPECT(state_in_reg == PTHREAD_CANCEL_DISABLE);
      if (i > 0) EXPECT(state_in_dereg == PTHREAD_CANCEL_DISABLE);
      EXPECT(cancel_state_now() == before);
      EXPECT_OK(mrcache_release(j->c, l));
    }
  }
  pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, NULL);
  j->returned = 1;
  return NULL;
}

static void case_cancel_state(void) {
  size_t page = hc_page();
  reset(&reg_state);
  mrcache_t *c = hc_create_cfg(&reg_state, 1);
  char *buf = hc_map(8 * page);
  struct job j = { .c = c, .buf = buf, .len = page };
  run(evicting_misses, &j);
  EXPECT(j.returned);
  EXPECT(atomic_load(&reg_state.dereg) >= 6); /* the evictions ran their deregs */
  check_destroy("cancel state of an evicting miss's callbacks", c, &reg_state);
  munmap(buf, 8 * page);
}

int main(int argc, char **argv) {
  hc_init("callback_escapes");
  long rounds = hc_param(argc, argv, "HANG_ITERS", 3);
  for (long i = 0; i < rounds; i++) {
    case_exit_in_reg();
    case_exit_in_dereg();
    case_cancel_in_reg();
    case_longjmp_in_reg();
    case_nested_exit();
    case_service_thread_exit();
    case_cancel_state();
  }
  return hc_finish();
}
