/* race-concurrent-miss (reduced) through libmrcache: the scenario of
 * ../libfabric/race-concurrent-miss.c. main acquires and releases buf1; a
 * new thread, which has not called malloc yet, acquires buf2 (a miss: its
 * first malloc, and glibc's set-up of its arena, which munmaps, happen inside
 * the acquire). libmrcache holds no lock that a release event waits for
 * (spec.md P6, H1): the acquire returns. Exits 0 when it does within 5 s, 1
 * with a DEADLOCK line if not. Monitor: userfaultfd. */
#define _GNU_SOURCE
#include "mrc_reg.h"
#include <semaphore.h>
#include <time.h>

#define LEN 8192

static mrcache_t *c;
static sem_t done;
static int t_slot = -1;

static void *thread_t(void *buf)
{
	mrcache_lease_t l;

	t_slot = mrc_acquire(c, buf, LEN, &l);
	mrc_release(c, l);
	sem_post(&done);
	return NULL;
}

int main(void)
{
	mrcache_lease_t l;
	struct timespec until;
	unsigned char *buf;
	pthread_t t;

	setvbuf(stdout, NULL, _IOLBF, 0);
	sem_init(&done, 0, 0);
	ur_init();
	c = mrc_create(MRCACHE_MONITOR_UFFD, MRCACHE_OVERLAP_INDEPENDENT, 0);
	buf = mmap(NULL, 2 * LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		return 2;
	memset(buf, 0x5a, 2 * LEN);
	printf("main: mrcache_acquire(%p) -> slot %d\n", (void *)buf, mrc_acquire(c, buf, LEN, &l));
	mrc_release(c, l);

	pthread_create(&t, NULL, thread_t, buf + LEN);
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 5;
	if (sem_timedwait(&done, &until)) {
		printf("DEADLOCK: mrcache_acquire(%p) in a new thread has not returned in 5 s\n", (void *)(buf + LEN));
		fflush(stdout);
		_exit(1);
	}
	pthread_join(t, NULL);
	printf("ok: the acquire in a new thread returned (slot %d)\n", t_slot);
	return mrcache_destroy(c) == MRCACHE_OK ? 0 : 2;
}
