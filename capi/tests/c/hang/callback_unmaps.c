/* callback_unmaps.c: dereg callbacks that release the memory they deregister.
 *
 * The header lets a callback free or unmap memory, registered memory
 * included ("with MRCACHE_MONITOR_UFFD the monitor thread sees it"). When
 * the deregistration runs on the monitor's side (the monitor invalidated the
 * registration), that release is an event the monitor itself must read: a
 * monitor that runs callbacks on the thread that reads the userfaultfd
 * waits for itself there, forever.
 *
 * 1. unmap, monitor side: map 8 pages, acquire and release them (cached,
 *    watched), munmap the first page; the monitor deregisters the
 *    registration and `dereg` munmaps the registration's own range (its
 *    addr/len, recorded in the handle at `reg`).
 * 2. unmap, caller side: the same callback run by mrcache_trim, by an
 *    eviction inside mrcache_acquire (max_regions 2) and by mrcache_destroy.
 * 3. free: the registered memory is a malloc'd buffer and `dereg` frees it:
 *    large buffers (glibc serves them by mmap; free munmaps them),
 *    invalidated by a madvise(DONTNEED) of one of their pages (monitor
 *    side); small heap buffers freed by mrcache_destroy's deregistrations.
 * Then mrcache_destroy must return OK, and every registration has had its
 * deregistration.
 *
 *   callback_unmaps [ITERATIONS]   rounds of each part (or HANG_ITERS; default 50)
 *   HANG_PART=1|2|3                only that part (default: all, in order) */
#define _GNU_SOURCE
#include "hang_common.h"

static void unmap_own_range(struct hc_reg *r, struct hc_rec *rec) {
  (void)r;
  if (munmap(rec->addr, rec->len) != 0) {
    fprintf(stderr, "%s: munmap in dereg: %s\n", hc_name, strerror(errno));
    atomic_fetch_add(&hc_failures, 1);
  }
}

/* A registered buffer and the references to it: one per registration made
 * of it, and the test's own until its acquire returned. A cache may
 * register one acquire more than once (A7 retries a registration an event
 * or a closing window made stale, and deregisters the first), so the
 * buffer is freed by the last deregistration, not by the first. */
struct owned {
  void *buf;
  atomic_int refs;
};

static void drop_owned(struct owned *o) {
  if (atomic_fetch_sub(&o->refs, 1) == 1) {
    free(o->buf);
    free(o);
  }
}

static int take_ref(struct hc_reg *r, void *addr, size_t len) {
  (void)r; (void)addr; (void)len;
  struct owned *o = hc_next_owner;
  if (o) atomic_fetch_add(&o->refs, 1);
  return 0;
}

static void free_owner(struct hc_reg *r, struct hc_rec *rec) {
  (void)r;
  if (rec->owner) drop_owned(rec->owner);
}

static struct owned *owned(void *buf) {
  struct owned *o = malloc(sizeof *o);
  if (!o) abort();
  o->buf = buf;
  atomic_init(&o->refs, 1);
  return o;
}

static void wait_deregs(struct hc_reg *r, unsigned long n) {
  while (atomic_load(&r->dereg) < n) usleep(200);
}

int main(int argc, char **argv) {
  hc_init("callback_unmaps");
  long iters = hc_param(argc, argv, "HANG_ITERS", 50);
  size_t page = hc_page();
  long only = hc_env("HANG_PART", 0);

  /* 1. The monitor's deregistration munmaps the registration's range. */
  if (!only || only == 1) {
  static struct hc_reg r1 = { .on_dereg = unmap_own_range };
  mrcache_t *c1 = hc_create(&r1);
  printf("callback_unmaps: 1. %ld x munmap of a registered page; dereg (monitor side) munmaps the rest\n", iters);
  for (long i = 0; i < iters; i++) {
    char *buf = hc_map(8 * page);
    unsigned long before = atomic_load(&r1.dereg);
    hc_touch(c1, buf, 8 * page);
    EXPECT(munmap(buf, page) == 0); /* the monitor invalidates; dereg unmaps buf+page.. */
    wait_deregs(&r1, before + 1);
  }
  mrcache_stats_t s = { .size = sizeof s };
  EXPECT_OK(mrcache_stats(c1, &s));
  EXPECT(s.cached_entries == 0);
  EXPECT_OK(mrcache_destroy(c1));
  hc_check_balanced("part 1", &r1);
  }

  /* 2. The same callback on the caller's side: trim, eviction, destroy. */
  if (!only || only == 2) {
  printf("callback_unmaps: 2. dereg munmaps from mrcache_trim, an eviction, mrcache_destroy\n");
  static struct hc_reg r2 = { .on_dereg = unmap_own_range };
  mrcache_t *c2 = hc_create_cfg(&r2, 2);
  for (long i = 0; i < iters; i++) {
    char *a = hc_map(4 * page), *b = hc_map(4 * page), *c = hc_map(4 * page);
    hc_touch(c2, a, 4 * page);
    hc_touch(c2, b, 4 * page);
    hc_touch(c2, c, 4 * page); /* evicts a: dereg munmaps it inside the acquire */
    if (i % 2) {
      EXPECT_OK(mrcache_trim(c2)); /* b and c */
    } else {
      EXPECT_OK(mrcache_flush(c2));
    }
    wait_deregs(&r2, atomic_load(&r2.reg));
  }
  for (int k = 0; k < 2; k++) hc_touch(c2, hc_map(4 * page), 4 * page);
  EXPECT_OK(mrcache_destroy(c2)); /* its deregs munmap the last two */
  hc_check_balanced("part 2", &r2);
  }

  /* 3. dereg frees a malloc'd buffer that was registered. */
  if (!only || only == 3) {
  printf("callback_unmaps: 3. dereg frees registered malloc'd buffers (monitor side and destroy)\n");
  static struct hc_reg r3 = { .on_reg = take_ref, .on_dereg = free_owner };
  mrcache_t *c3 = hc_create(&r3);
  long skipped = 0;
  for (long i = 0; i < iters; i++) {
    size_t len = 256 * 1024 + (size_t)(i % 7) * page; /* above the mmap threshold */
    char *buf = malloc(len);
    EXPECT(buf != NULL);
    if (!buf) break;
    memset(buf, 1, len);
    unsigned long before = atomic_load(&r3.dereg);
    struct owned *o = owned(buf);
    hc_next_owner = o; /* each registration made of it holds a reference */
    mrcache_lease_t l;
    mrcache_status_t st = mrcache_acquire(c3, buf, len, MRCACHE_ACCESS_LOCAL_WRITE, &l);
    hc_next_owner = NULL;
    EXPECT_ST(st, MRCACHE_OK);
    if (st != MRCACHE_OK) {
      drop_owned(o);
      continue;
    }
    /* The lease keeps its registration (and so the buffer) alive. */
    drop_owned(o);
    EXPECT_OK(mrcache_release(c3, l));
    if (atomic_load(&r3.dereg) != before) {
      skipped++; /* served uncached: already deregistered (and freed) at its release */
      continue;
    }
    /* An interior page: the monitor deregisters, dereg frees (munmaps) it all. */
    char *inner = (char *)(((uintptr_t)buf + 2 * page) & ~(uintptr_t)(page - 1));
    /* The madvise waits until the monitor reads its REMOVE; the service
     * thread may then deregister (free, munmap) the buffer before the
     * madvise resumes, which then finds the range gone (ENOMEM). */
    if (madvise(inner, page, MADV_DONTNEED) != 0 && errno != ENOMEM) {
      fprintf(stderr, "%s: madvise of an inner page: %s\n", hc_name, strerror(errno));
      atomic_fetch_add(&hc_failures, 1);
    }
    wait_deregs(&r3, before + 1);
  }
  /* Small heap buffers, freed by mrcache_destroy's deregistrations. */
  for (long i = 0; i < iters; i++) {
    size_t len = 8192 + (size_t)(i % 13) * 1000;
    char *buf = malloc(len);
    EXPECT(buf != NULL);
    if (!buf) break;
    memset(buf, 2, len);
    struct owned *o = owned(buf);
    hc_next_owner = o;
    mrcache_lease_t l;
    mrcache_status_t st = mrcache_acquire(c3, buf, len, MRCACHE_ACCESS_LOCAL_WRITE, &l);
    hc_next_owner = NULL;
    EXPECT_ST(st, MRCACHE_OK);
    if (st == MRCACHE_OK) EXPECT_OK(mrcache_release(c3, l));
    drop_owned(o); /* freed here if no registration holds it (a hit, or a failure) */
  }
  EXPECT_OK(mrcache_destroy(c3));
  hc_check_balanced("part 3", &r3);
  if (skipped) printf("callback_unmaps: %ld large buffers were served uncached (freed at their release)\n", skipped);
  }
  printf("callback_unmaps: every mrcache_destroy returned\n");
  return hc_finish();
}
