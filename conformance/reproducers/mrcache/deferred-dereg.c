/* deferred-dereg through libmrcache: the scenario of ../grdma/deferred-dereg.c.
 * Two leases on one registration, munmap of the whole buffer while they are
 * held, map it anew, release one lease, acquire again, the device writes
 * through the new lease's registration. libmrcache (spec.md S5.3) takes the
 * registration out of the lookup, keeps it pinned until its last lease is
 * released, and the job goes on. Exits 0 when munmap returns, the later
 * acquire gets the new frames and the registration is deregistered exactly
 * once; 1 otherwise. Monitor: userfaultfd. */
#define _GNU_SOURCE
#include "mrc_reg.h"

#define LEN 8192

int main(void)
{
	mrcache_lease_t l1, l2, l3;
	mrcache_stats_t s = { .size = sizeof(s) };
	unsigned char *buf, *again;
	int slot, st;
	long live;

	setvbuf(stdout, NULL, _IOLBF, 0);
	ur_init();
	mrcache_t *c = mrc_create(MRCACHE_MONITOR_UFFD, MRCACHE_OVERLAP_INDEPENDENT, 0);
	buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		return 2;
	memset(buf, 0x5a, LEN);

	mrc_acquire(c, buf, LEN, &l1);
	mrc_acquire(c, buf, 4096, &l2);
	printf("munmap(%p, %d) with two leases held on its registration\n", (void *)buf, LEN);
	if (munmap(buf, LEN))
		return 2;
	printf("munmap returned\n");
	again = mmap(buf, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (again != buf)
		return 2;
	mrc_release(c, l1);
	slot = mrc_acquire(c, buf, LEN, &l3);
	st = ur_check_write("after the unmap", slot, buf, LEN, 0x11, 0xab);
	mrc_release(c, l2);
	mrc_release(c, l3);
	mrcache_stats(c, &s);
	if (mrcache_destroy(c) != MRCACHE_OK)
		return 2;
	live = ur.live;
	printf("registrations %lu, deregistrations %lu, still pinned after destroy %ld\n", (unsigned long)s.registrations,
	       (unsigned long)s.deregistrations, live);
	if (live) {
		printf("LEAK: %ld registrations still pinned after mrcache_destroy\n", live);
		return 1;
	}
	return st;
}
