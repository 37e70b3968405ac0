/* Open MPI 4.1.4 rcache/grdma: after fork(), the child's registration cache
 * returns the parent's registration, which pins the parent's frames (P2).
 *
 * Library: Open MPI 4.1.4 (Debian bookworm libopenmpi-dev 4.1.4-3+b1),
 *   libopen-pal's rcache framework with the grdma component, initialised
 *   with opal_init (no mpirun) as a BTL would (register_mem/deregister_mem
 *   are ours: they pin with io_uring fixed buffers, see ../uring_reg.h).
 * Kernel: any with io_uring fixed buffers (5.13+); seen on Linux 6.18.
 *
 * Sequence (one thread):
 *   1. buf = 8 KiB anonymous memory; rcache_register(buf) -> R1 (pins the
 *      frames behind buf); rcache_deregister(R1): R1 stays cached
 *      (leave_pinned).
 *   2. fork(). In the child, buf is backed by new frames: the kernel copies
 *      pinned anonymous pages into the child at fork (or at the child's
 *      first write, copy-on-write); R1 keeps pinning the parent's.
 *   3. In the child: rcache_register(buf) -> R1 again (a hit).
 *   4. The "NIC" writes 0xAB through R1 into buf (an RDMA write to the MR;
 *      here IORING_OP_READ_FIXED into R1's fixed buffer); the child reads buf.
 * Expected: the child's cache does not serve the parent's registrations
 *   (nothing registered before the fork pins the child's frames); step 3
 *   misses and registers the child's frames, and the child reads 0xAB.
 * Observed: step 3 hits R1; the child reads its own 0x11 while the device's
 *   bytes went into the parent's frames (the parent reads 0xAB in its buf,
 *   which it never asked for):
 *     STALE: child: the device wrote 0xab x 8192 through registration ...
 * Responsible: nothing in grdma or the memory patcher handles fork. grdma
 *   registers no pthread_atfork handler and keys its cache by virtual address
 *   only (opal/mca/rcache/grdma/rcache_grdma_module.c, mca_rcache_grdma_register:
 *   the mca_rcache_base_vma_iterate(..., mca_rcache_grdma_check_cached, ...)
 *   lookup returns any valid registration covering [base, bound], whatever
 *   process made it). Line numbers not pinned: the 4.1.4 sources are not
 *   installed here; function names checked against open-mpi/ompi's file.
 *   With ibv_fork_init()/RDMAV_FORK_SAFE the parent's MR pages are
 *   MADV_DONTFORK and absent from the child; the child maps buf anew and the
 *   same hit happens (fork-child-unmap in the conformance suite).
 *
 * Build: OMPI=/usr/lib/x86_64-linux-gnu/openmpi
 *   gcc -O1 -g -Wall -I.. -I$OMPI/include/openmpi -I$OMPI/include fork-cached.c \
 *       -L$OMPI/lib -Wl,-rpath,$OMPI/lib -lopen-pal -o fork-cached
 * Run: ./fork-cached   exit 1 and a STALE line: the bug; 0: fixed; 2: setup error.
 * The same scenario through libmrcache: ../mrcache/fork-cached.c (exits 0).
 * Written for the mrcache project (conformance/reproducers). */
#define _GNU_SOURCE
#include "opal_config.h"
#include "opal/runtime/opal.h"
#include "opal/mca/base/base.h"
#include "opal/mca/rcache/rcache.h"
#include "opal/mca/rcache/base/base.h"
#include "uring_reg.h"
#include <sys/wait.h>

typedef struct {
	mca_rcache_base_registration_t super;
	int slot; /* the io_uring fixed buffer: our "MR" */
} my_reg_t;

#define RW (MCA_RCACHE_ACCESS_LOCAL_WRITE | MCA_RCACHE_ACCESS_REMOTE_READ | MCA_RCACHE_ACCESS_REMOTE_WRITE)
#define LEN 8192

static int my_register_mem(void *reg_data, void *base, size_t size, mca_rcache_base_registration_t *reg)
{
	int s = ur_reg(base, size);
	(void)reg_data;
	if (s < 0)
		return OPAL_ERR_OUT_OF_RESOURCE;
	((my_reg_t *)reg)->slot = s;
	printf("register_mem  [%p, +%zu) -> slot %d (pid %d)\n", base, size, s, (int)getpid());
	return OPAL_SUCCESS;
}

static int my_deregister_mem(void *reg_data, mca_rcache_base_registration_t *reg)
{
	(void)reg_data;
	printf("deregister_mem slot %d\n", ((my_reg_t *)reg)->slot);
	ur_dereg(((my_reg_t *)reg)->slot);
	return OPAL_SUCCESS;
}

static mca_rcache_base_module_t *grdma_init(void)
{
	int argc = 1;
	char *argv0[] = { "fork-cached", NULL }, **argv = argv0;
	mca_rcache_base_resources_t res;
	mca_rcache_base_module_t *rc;

	if (opal_init(&argc, &argv) != OPAL_SUCCESS || mca_base_framework_open(&opal_rcache_base_framework, 0) != OPAL_SUCCESS) {
		fprintf(stderr, "opal_init or the rcache framework failed\n");
		exit(2);
	}
	memset(&res, 0, sizeof(res));
	res.cache_name = "repro";
	res.sizeof_reg = sizeof(my_reg_t);
	res.register_mem = my_register_mem;
	res.deregister_mem = my_deregister_mem;
	rc = mca_rcache_base_module_create("grdma", NULL, &res);
	if (!rc) {
		fprintf(stderr, "mca_rcache_base_module_create(grdma) failed\n");
		exit(2);
	}
	return rc;
}

static int acquire(mca_rcache_base_module_t *rc, void *a, mca_rcache_base_registration_t **r)
{
	if (rc->rcache_register(rc, a, LEN, 0, RW, r) != OPAL_SUCCESS) {
		fprintf(stderr, "rcache_register failed\n");
		exit(2);
	}
	return ((my_reg_t *)*r)->slot;
}

int main(void)
{
	mca_rcache_base_module_t *rc;
	mca_rcache_base_registration_t *r;
	unsigned char *buf;
	int slot, st = 0;
	pid_t pid;

	setvbuf(stdout, NULL, _IOLBF, 0);
	ur_init();
	rc = grdma_init();
	buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		return 2;
	memset(buf, 0x5a, LEN);

	slot = acquire(rc, buf, &r); /* 1 */
	if (ur_check_write("parent, before the fork", slot, buf, LEN, 0x11, 0xcd))
		return 2;
	rc->rcache_deregister(rc, r);

	fflush(stdout);
	pid = fork(); /* 2 */
	if (pid < 0)
		return 2;
	if (pid == 0) {
		slot = acquire(rc, buf, &r); /* 3 */
		printf("child: rcache_register(%p) -> slot %d\n", (void *)buf, slot);
		st = ur_check_write("child", slot, buf, LEN, 0x11, 0xab); /* 4 */
		rc->rcache_deregister(rc, r);
		fflush(stdout);
		_exit(st);
	}
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) {
		fprintf(stderr, "the child did not exit normally (status 0x%x)\n", st);
		return 2;
	}
	if (WEXITSTATUS(st) == 1 && buf[0] == 0xab)
		printf("STALE: and the parent's buf now holds 0xab: the child's transfer went into the parent's memory\n");
	return WEXITSTATUS(st);
}
