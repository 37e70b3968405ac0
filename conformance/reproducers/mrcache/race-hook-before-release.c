/* race-hook-before-release through libmrcache: the scenario of
 * ../ucx/race-hook-before-release.c and ../grdma/race-hook-before-release.c.
 * A memory hook that runs before munmap (as UCM's, Open MPI's patcher's and
 * libfabric's memhooks do) calls mrcache_release_begin before the syscall
 * and mrcache_release_end after it (capi/include/mrcache.h). Thread U's
 * "hook" opens the window and holds U there, before the munmap; meanwhile
 * main acquires the range (served, but not cached: spec.md S1.8, S2.9); U
 * munmaps and closes the window; main maps the range anew and acquires it;
 * the device writes through the registration main got. Exits 0 when the
 * device's bytes land where main reads them, 1 with a STALE line if not.
 * Monitor: explicit (the hook is the monitor, as with the peers'). */
#define _GNU_SOURCE
#include "mrc_reg.h"
#include <semaphore.h>

#define LEN 8192

static sem_t hooked, go;
static mrcache_t *c;

/* What a munmap hook does with libmrcache: begin before, end after. */
static int hooked_munmap(void *a, size_t len)
{
	int r;

	mrcache_release_begin(c, a, len);
	printf("U: mrcache_release_begin(%p): the cache has seen the unmap, the munmap has not run\n", a);
	sem_post(&hooked);
	sem_wait(&go);
	r = munmap(a, len);
	mrcache_release_end(c, a, len);
	return r;
}

static void *thread_u(void *buf)
{
	if (hooked_munmap(buf, LEN))
		perror("munmap");
	printf("U: munmap(%p) returned\n", buf);
	return NULL;
}

int main(void)
{
	mrcache_lease_t l;
	unsigned char *buf, *again;
	pthread_t u;
	int slot, st;

	setvbuf(stdout, NULL, _IOLBF, 0);
	sem_init(&hooked, 0, 0);
	sem_init(&go, 0, 0);
	ur_init();
	c = mrc_create(MRCACHE_MONITOR_EXPLICIT, MRCACHE_OVERLAP_MERGE, 0);
	buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		return 2;
	memset(buf, 0x5a, LEN);

	slot = mrc_acquire(c, buf, LEN, &l);
	mrc_release(c, l);

	pthread_create(&u, NULL, thread_u, buf);
	sem_wait(&hooked);
	slot = mrc_acquire(c, buf, LEN, &l);
	printf("main: mrcache_acquire(%p) during the unmap -> slot %d\n", (void *)buf, slot);
	mrc_release(c, l);
	sem_post(&go);
	pthread_join(u, NULL);

	again = mmap(buf, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (again != buf) {
		fprintf(stderr, "could not map %p anew\n", (void *)buf);
		return 2;
	}
	memset(buf, 0x77, LEN);
	slot = mrc_acquire(c, buf, LEN, &l);
	printf("main: mrcache_acquire(%p) after the unmap -> slot %d\n", (void *)buf, slot);
	st = ur_check_write("main, after the unmap", slot, buf, LEN, 0x11, 0xab);
	mrc_release(c, l);
	if (mrcache_destroy(c) != MRCACHE_OK)
		return 2;
	return st;
}
