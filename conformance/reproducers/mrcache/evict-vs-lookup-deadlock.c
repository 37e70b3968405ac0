/* evict-vs-lookup-deadlock through libmrcache: the scenario of
 * ../grdma/evict-vs-lookup-deadlock.c. Seven one-page registrations cached
 * and released (R7 first); thread A acquires a new page and the registrar
 * answers ENOMEM once, so the cache evicts its unleased registrations and
 * retries (spec.md S5.4); inside the first deregistration callback A lets
 * thread B acquire R1's page (a hit, or a miss if R1 was evicted already) and
 * waits up to 2 s for it; then A's acquire completes. libmrcache calls its
 * registrar with no cache lock held, so nothing B needs is held while A is in
 * the callback. Exits 0 when both acquires return within 5 s, 1 with a
 * DEADLOCK line if not. Monitor: userfaultfd. */
#define _GNU_SOURCE
#include "mrc_reg.h"
#include <sched.h>
#include <semaphore.h>
#include <time.h>

#define PAGE 4096
#define STRIDE 65536

static mrcache_t *c;
static unsigned char *arena;
static sem_t b_go, b_done, done;
static volatile int fail_regs, hold_in_dereg;
static volatile pid_t tid_a;

static int reg_enomem_once(void *ctx, void *addr, size_t len, uint32_t access, void **handle, uint32_t *lkey, uint32_t *rkey)
{
	if (fail_regs > 0) {
		fail_regs--;
		return ENOMEM; /* as ibv_reg_mr at the pinning limit */
	}
	return mrc_reg(ctx, addr, len, access, handle, lkey, rkey);
}

static int dereg_hold(void *ctx, void *handle)
{
	int r = mrc_dereg(ctx, handle);

	if (hold_in_dereg && gettid() == tid_a) {
		struct timespec until;
		hold_in_dereg = 0;
		sem_post(&b_go);
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += 2;
		if (sem_timedwait(&b_done, &until))
			printf("A: B's acquire has not returned while A is in the deregistration callback\n");
		else
			printf("A: B's acquire returned while A is in the deregistration callback\n");
	}
	return r;
}

static void acquire_release(int key)
{
	mrcache_lease_t l;

	mrc_acquire(c, arena + (size_t)key * STRIDE, PAGE, &l);
	mrc_release(c, l);
}

static cpu_set_t one_cpu;

static void *thread_a(void *arg)
{
	(void)arg;
	pthread_setaffinity_np(pthread_self(), sizeof(one_cpu), &one_cpu);
	tid_a = gettid();
	fail_regs = 1;
	hold_in_dereg = 1;
	acquire_release(8);
	sem_post(&done);
	return NULL;
}

static void *thread_b(void *arg)
{
	struct sched_param sp = { 0 };

	(void)arg;
	/* As in the grdma program: B on A's CPU, SCHED_IDLE. */
	pthread_setaffinity_np(pthread_self(), sizeof(one_cpu), &one_cpu);
	sched_setscheduler(0, SCHED_IDLE, &sp);
	sem_wait(&b_go);
	acquire_release(1);
	sem_post(&b_done);
	sem_post(&done);
	return NULL;
}

int main(void)
{
	static const int release_order[] = { 7, 4, 1, 2, 3, 5, 6 };
	static const mrcache_registrar_t r = { NULL, reg_enomem_once, dereg_hold };
	mrcache_lease_t l[8];
	mrcache_config_t cfg;
	struct timespec until;
	pthread_t a, b;
	int i, finished = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	ur_init();
	mrcache_config_init(&cfg);
	cfg.monitor = MRCACHE_MONITOR_UFFD;
	if (mrcache_create(&cfg, &r, &c) != MRCACHE_OK) {
		fprintf(stderr, "mrcache_create: %s\n", mrcache_last_error(NULL));
		return 2;
	}
	arena = mmap(NULL, 9 * STRIDE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (arena == MAP_FAILED)
		return 2;
	memset(arena, 0x5a, 9 * STRIDE);
	for (i = 1; i <= 7; i++)
		mrc_acquire(c, arena + (size_t)i * STRIDE, PAGE, &l[i]);
	for (i = 0; i < 7; i++)
		mrc_release(c, l[release_order[i]]);

	sem_init(&b_go, 0, 0);
	sem_init(&b_done, 0, 0);
	sem_init(&done, 0, 0);
	CPU_ZERO(&one_cpu);
	CPU_SET(sched_getcpu(), &one_cpu);
	pthread_create(&b, NULL, thread_b, NULL);
	pthread_create(&a, NULL, thread_a, NULL);
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 5;
	while (finished < 2 && sem_timedwait(&done, &until) == 0)
		finished++;
	if (finished < 2) {
		printf("DEADLOCK: after 5 s %d of the two acquires have not returned\n", 2 - finished);
		fflush(stdout);
		_exit(1);
	}
	pthread_join(a, NULL);
	pthread_join(b, NULL);
	printf("ok: both acquires returned\n");
	return mrcache_destroy(c) == MRCACHE_OK ? 0 : 2;
}
