/* fork-cached through libmrcache: the scenario of ../grdma/fork-cached.c and
 * ../libfabric/fork-cached.c (register, release, fork, acquire again in the
 * child, the device writes through the registration the child got).
 * libmrcache's child cache starts empty (spec.md S2.6): the child's acquire
 * misses and registers the child's frames, and the device's bytes land where
 * the child reads them. Exits 0 when they do, 1 with a STALE line if not.
 * Monitor: userfaultfd (the library's own); in the child the cache caches
 * nothing until mrcache_monitor_start, which the child calls, as a program
 * that forks would. */
#define _GNU_SOURCE
#include "mrc_reg.h"
#include <sys/wait.h>

#define LEN 8192

int main(void)
{
	mrcache_t *c;
	mrcache_lease_t l;
	unsigned char *buf;
	int slot, st = 0;
	pid_t pid;

	setvbuf(stdout, NULL, _IOLBF, 0);
	ur_init();
	c = mrc_create(MRCACHE_MONITOR_UFFD, MRCACHE_OVERLAP_INDEPENDENT, 0);
	buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		return 2;
	memset(buf, 0x5a, LEN);

	slot = mrc_acquire(c, buf, LEN, &l);
	if (ur_check_write("parent, before the fork", slot, buf, LEN, 0x11, 0xcd))
		return 2;
	mrc_release(c, l);

	fflush(stdout);
	pid = fork();
	if (pid < 0)
		return 2;
	if (pid == 0) {
		int m = mrcache_monitor_start(c);
		if (m != MRCACHE_OK)
			printf("child: mrcache_monitor_start: %s (the child's cache then serves uncached)\n", mrcache_status_name(m));
		slot = mrc_acquire(c, buf, LEN, &l);
		printf("child: mrcache_acquire(%p) -> slot %d\n", (void *)buf, slot);
		st = ur_check_write("child", slot, buf, LEN, 0x11, 0xab);
		mrc_release(c, l);
		if (mrcache_destroy(c) != MRCACHE_OK)
			st = st ? st : 2;
		fflush(stdout);
		_exit(st);
	}
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) {
		fprintf(stderr, "the child did not exit normally (status 0x%x)\n", st);
		return 2;
	}
	if (buf[0] != 0xcd) {
		printf("STALE: the parent's buf holds 0x%02x after the child's transfer (expected its own 0xcd)\n", buf[0]);
		return 1;
	}
	if (mrcache_destroy(c) != MRCACHE_OK)
		return 2;
	return WEXITSTATUS(st);
}
