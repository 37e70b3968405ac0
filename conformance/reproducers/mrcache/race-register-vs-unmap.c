/* race-register-vs-unmap through libmrcache: the scenario of
 * ../grdma/race-register-vs-unmap.c and ../libfabric/race-register-vs-unmap.c.
 * Thread T acquires buf; its reg callback pins the frames and waits; main
 * munmaps buf (libmrcache's userfaultfd monitor sees it), maps it anew;
 * T's registration completes; then main acquires buf, and the device writes
 * through the registration main got. libmrcache re-checks before caching
 * (spec.md S3.7): the registration made across the unmap is not cached, the
 * later acquire misses and pins the new frames. Exits 0 when the device's
 * bytes land where main reads them, 1 with a STALE line if not.
 * MRC_MONITOR=explicit runs it with mrcache_invalidate after the munmap
 * instead of the userfaultfd monitor. */
#define _GNU_SOURCE
#include "mrc_reg.h"
#include <semaphore.h>

#define LEN 8192

static sem_t pinned, go;
static mrcache_t *c;

static void pause_after_pin(void)
{
	sem_post(&pinned);
	sem_wait(&go);
}

static void *thread_t(void *buf)
{
	mrcache_lease_t l;

	mrc_in_reg = pause_after_pin;
	printf("T: mrcache_acquire(%p) -> slot %d\n", buf, mrc_acquire(c, buf, LEN, &l));
	mrc_release(c, l);
	return NULL;
}

int main(void)
{
	int explicit_mon = getenv("MRC_MONITOR") && !strcmp(getenv("MRC_MONITOR"), "explicit");
	mrcache_lease_t l;
	unsigned char *buf, *again;
	pthread_t t;
	int slot, st;

	setvbuf(stdout, NULL, _IOLBF, 0);
	sem_init(&pinned, 0, 0);
	sem_init(&go, 0, 0);
	ur_init();
	c = mrc_create(explicit_mon ? MRCACHE_MONITOR_EXPLICIT : MRCACHE_MONITOR_UFFD, MRCACHE_OVERLAP_INDEPENDENT, 0);
	printf("libmrcache, monitor %s\n", explicit_mon ? "explicit (mrcache_invalidate)" : "userfaultfd");
	buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		return 2;
	memset(buf, 0x5a, LEN);

	pthread_create(&t, NULL, thread_t, buf);
	sem_wait(&pinned);
	if (munmap(buf, LEN))
		return 2;
	if (explicit_mon)
		mrcache_invalidate(c, buf, LEN);
	again = mmap(buf, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (again != buf) {
		fprintf(stderr, "could not map %p anew\n", (void *)buf);
		return 2;
	}
	memset(buf, 0x77, LEN);
	printf("main: munmap(%p) returned, mapped anew\n", (void *)buf);
	sem_post(&go);
	pthread_join(t, NULL);

	slot = mrc_acquire(c, buf, LEN, &l);
	printf("main: mrcache_acquire(%p) -> slot %d\n", (void *)buf, slot);
	st = ur_check_write("main, after the unmap", slot, buf, LEN, 0x11, 0xab);
	mrc_release(c, l);
	if (mrcache_destroy(c) != MRCACHE_OK)
		return 2;
	return st;
}
