/* sysv_shm.c: memory the monitor cannot watch is refused, not cached
 * unwatched.
 *
 * A SysV shared memory segment (shmget/shmat) outlives its mappings: it is
 * released by shmctl(IPC_RMID) after shmdt, which the userfaultfd monitor
 * does not see, so a registration of it could go stale unnoticed. The fix
 * refuses it with a new status, MRCACHE_UNWATCHABLE (23: "the monitor
 * cannot watch this memory: SysV shared memory or a file mapping"), and
 * mrcache_last_error names SysV. A memfd mapped MAP_SHARED (anonymous
 * shared memory the monitor watches) is accepted: cached, a hit the second
 * time, and invalidated by its munmap.
 *
 *   sysv_shm [ROUNDS]              (or HANG_ITERS; default 3) */
#define _GNU_SOURCE
#include "hang_common.h"
#include <sys/ipc.h>
#include <sys/shm.h>

/* MRCACHE_UNWATCHABLE, which the current header does not have: compared by
 * value so the test builds against both. */
#define UNWATCHABLE ((mrcache_status_t)23)

int main(int argc, char **argv) {
  hc_init("sysv_shm");
  long rounds = hc_param(argc, argv, "HANG_ITERS", 3);
  size_t page = hc_page(), len = 16 * page;
  static struct hc_reg r;
  mrcache_t *c = hc_create(&r);
  for (long i = 0; i < rounds; i++) {
    int id = shmget(IPC_PRIVATE, len, IPC_CREAT | 0600);
    if (id < 0) {
      perror("shmget");
      return 1;
    }
    char *seg = shmat(id, NULL, 0);
    shmctl(id, IPC_RMID, NULL); /* goes with the last detach */
    if (seg == (void *)-1) {
      perror("shmat");
      return 1;
    }
    memset(seg, 3, len);
    mrcache_lease_t l;
    mrcache_status_t st = mrcache_acquire(c, seg, len, MRCACHE_ACCESS_LOCAL_WRITE, &l);
    const char *msg = mrcache_last_error(NULL);
    if (i == 0)
      printf("sysv_shm: acquire of a SysV segment gave %s (%d): \"%s\"\n", mrcache_status_name(st), (int)st,
             st == MRCACHE_OK ? "" : msg);
    if (st != UNWATCHABLE) {
      fprintf(stderr, "sysv_shm: acquire of a SysV segment gave %s (%d), expected 23 (MRCACHE_UNWATCHABLE)\n",
              mrcache_status_name(st), (int)st);
      atomic_fetch_add(&hc_failures, 1);
    } else if (!strstr(msg, "SysV")) {
      fprintf(stderr, "sysv_shm: the message does not name SysV: \"%s\"\n", msg);
      atomic_fetch_add(&hc_failures, 1);
    }
    if (st == MRCACHE_OK) EXPECT_OK(mrcache_release(c, l));
    EXPECT(shmdt(seg) == 0);

    /* A memfd mapped MAP_SHARED is watched: accepted, cached, invalidated. */
    int fd = memfd_create("mrcache-sysv-shm-test", 0);
    EXPECT(fd >= 0);
    EXPECT(ftruncate(fd, (off_t)len) == 0);
    char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    EXPECT(m != MAP_FAILED);
    close(fd);
    if (m == MAP_FAILED) break;
    memset(m, 4, len);
    mrcache_stats_t s0 = { .size = sizeof s0 }, s1 = { .size = sizeof s1 };
    EXPECT_OK(mrcache_stats(c, &s0));
    hc_touch(c, m, len);
    hc_touch(c, m, len);
    EXPECT_OK(mrcache_stats(c, &s1));
    EXPECT(s1.hits == s0.hits + 1); /* cached */
    unsigned long before = atomic_load(&r.dereg);
    HC_TIMED("munmap of a registered memfd mapping", 1.0, munmap(m, len));
    while (atomic_load(&r.dereg) == before) usleep(200); /* the monitor saw it */
  }
  printf("sysv_shm: a memfd MAP_SHARED mapping is cached and its munmap seen\n");
  EXPECT_OK(mrcache_destroy(c));
  hc_check_balanced("after destroy", &r);
  return hc_finish();
}
