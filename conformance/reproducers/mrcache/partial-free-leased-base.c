/* partial-free-leased-base through libmrcache: the scenario of
 * ../grdma/partial-free-leased-base.c. A leased 16 KiB registration, munmap
 * of its first page, acquire of its second page, release both, map the first
 * page anew, acquire the whole buffer, the device writes through it.
 * libmrcache (spec.md S5.3) takes the registration out of the lookup at the
 * munmap, keeps it pinned until its lease is released, and the job goes on.
 * Exits 0 when munmap returns and the last acquire gets the frames mapped
 * now; 1 otherwise. Monitor: userfaultfd. */
#define _GNU_SOURCE
#include "mrc_reg.h"

#define LEN 16384
#define PAGE 4096

int main(void)
{
	mrcache_lease_t l1, l2, l3;
	unsigned char *buf, *again;
	int slot, st;

	setvbuf(stdout, NULL, _IOLBF, 0);
	ur_init();
	mrcache_t *c = mrc_create(MRCACHE_MONITOR_UFFD, MRCACHE_OVERLAP_INDEPENDENT, 0);
	buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		return 2;
	memset(buf, 0x5a, LEN);

	mrc_acquire(c, buf, LEN, &l1);
	printf("munmap(%p, %d): the first page of a leased registration\n", (void *)buf, PAGE);
	if (munmap(buf, PAGE))
		return 2;
	printf("munmap returned\n");
	mrc_acquire(c, buf + PAGE, PAGE, &l2);
	mrc_release(c, l1);
	mrc_release(c, l2);
	again = mmap(buf, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (again != buf)
		return 2;
	slot = mrc_acquire(c, buf, LEN, &l3);
	st = ur_check_write("after the partial unmap", slot, buf, LEN, 0x11, 0xab);
	mrc_release(c, l3);
	if (mrcache_destroy(c) != MRCACHE_OK)
		return 2;
	return st;
}
