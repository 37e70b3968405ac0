/* The io_uring registrar of ../uring_reg.h as a libmrcache registrar, and
 * small helpers, for the mrcache side of each reproducer: the same scenario
 * as ../<peer>/<case>.c through libmrcache's C API (capi/include/mrcache.h).
 * The lease's lkey is the fixed-buffer slot, so the "device" writes through
 * the registration the lease names. */
#ifndef MRC_REG_H
#define MRC_REG_H

#include "uring_reg.h"
#include <mrcache.h>

#define MRC_RW (MRCACHE_ACCESS_LOCAL_WRITE | MRCACHE_ACCESS_REMOTE_READ | MRCACHE_ACCESS_REMOTE_WRITE)

/* A hook the scenario can run inside the next reg callback (to pause it). */
static void (*mrc_in_reg)(void);

static int mrc_reg(void *ctx, void *addr, size_t len, uint32_t access, void **handle, uint32_t *lkey, uint32_t *rkey)
{
	int s = ur_reg(addr, len);
	void (*hook)(void) = mrc_in_reg;

	(void)ctx;
	(void)access;
	if (s < 0)
		return -s;
	printf("reg   [%p, +%zu) -> slot %d (pid %d)\n", addr, len, s, (int)getpid());
	*handle = (void *)(intptr_t)(s + 1);
	*lkey = *rkey = (uint32_t)s;
	if (hook) {
		mrc_in_reg = NULL;
		hook();
	}
	return 0;
}

static int mrc_dereg(void *ctx, void *handle)
{
	int s = (int)(intptr_t)handle - 1;

	(void)ctx;
	printf("dereg slot %d\n", s);
	return -ur_dereg(s);
}

static mrcache_t *mrc_create(uint32_t monitor, uint32_t overlap, uint64_t max_regions)
{
	static const mrcache_registrar_t r = { NULL, mrc_reg, mrc_dereg };
	mrcache_config_t cfg;
	mrcache_t *c;
	int st;

	mrcache_config_init(&cfg);
	cfg.monitor = monitor;
	cfg.overlap = overlap;
	cfg.max_regions = max_regions;
	st = mrcache_create(&cfg, &r, &c);
	if (st != MRCACHE_OK) {
		fprintf(stderr, "mrcache_create: %s: %s\n", mrcache_status_name(st), mrcache_last_error(NULL));
		exit(2);
	}
	return c;
}

/* Acquires [a, a+len) read-write; returns the slot of the lease's registration. */
static int mrc_acquire(mrcache_t *c, void *a, size_t len, mrcache_lease_t *l)
{
	uint32_t lkey, rkey;
	int st = mrcache_acquire(c, a, len, MRC_RW, l);

	if (st == MRCACHE_OK)
		st = mrcache_lease_keys(c, *l, &lkey, &rkey);
	if (st != MRCACHE_OK) {
		fprintf(stderr, "mrcache_acquire(%p, %zu): %s: %s\n", a, len, mrcache_status_name(st), mrcache_last_error(NULL));
		exit(2);
	}
	return (int)lkey;
}

static void mrc_release(mrcache_t *c, mrcache_lease_t l)
{
	int st = mrcache_release(c, l);

	if (st != MRCACHE_OK) {
		fprintf(stderr, "mrcache_release: %s: %s\n", mrcache_status_name(st), mrcache_last_error(NULL));
		exit(2);
	}
}

#endif
