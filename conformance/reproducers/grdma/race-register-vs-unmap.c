/* Open MPI 4.1.4 rcache/grdma: memory unmapped (and mapped anew) while
 * another thread's registration of it is in progress: grdma caches the
 * registration of the old frames, and every later rcache_register of the
 * range hits it (P2).
 *
 * Library: Open MPI 4.1.4 (Debian bookworm libopenmpi-dev 4.1.4-3+b1),
 *   libopen-pal's rcache framework with the grdma component, initialised
 *   with opal_init (no mpirun); Open MPI's memory patcher is the monitor.
 *   register_mem/deregister_mem are ours and pin with io_uring fixed
 *   buffers (../uring_reg.h), as a BTL's would with ibv_reg_mr.
 *   opal_set_using_threads(true) as under MPI_THREAD_MULTIPLE (with false,
 *   the default of this program's GRDMA_THREADS=0, it fails the same way).
 *
 * Sequence (two threads; the interleaving is forced with semaphores, no
 * timing involved):
 *   1. thread T: rcache_register(buf, 8 KiB): a miss; register_mem pins the
 *      frames behind buf and then waits (a slow ibv_reg_mr, or T preempted).
 *   2. main: munmap(buf) returns (the patcher's hook runs grdma's
 *      invalidate_range: nothing is cached yet); mmap(buf) anew, fills it.
 *   3. T: register_mem returns; grdma inserts the registration R1 of the
 *      *old* frames into its cache and returns it; T deregisters (R1 stays
 *      cached, leave_pinned).
 *   4. main: rcache_register(buf) -> R1 (a hit). The "NIC" writes 0xAB
 *      through R1 (IORING_OP_READ_FIXED into R1's fixed buffer); main reads buf.
 * Expected: the acquire of step 4 began after the munmap returned, so it
 *   must get a registration of the frames mapped now (spec: P2; the kernel's
 *   own answer is mmu_interval_read_begin/_retry): grdma should not cache a
 *   registration whose range was invalidated while it was being made.
 * Observed: step 4 hits R1 and the device's bytes go to the freed frames:
 *     STALE: main, after the unmap: the device wrote 0xab x 8192 through ...
 * Responsible: opal/mca/rcache/grdma/rcache_grdma_module.c,
 *   mca_rcache_grdma_register: after the `while (OPAL_ERR_OUT_OF_RESOURCE ==
 *   (rc = rcache_grdma->resources.register_mem(...)))` loop it calls
 *   mca_rcache_base_vma_insert(...) with no check that an invalidation of
 *   [base, bound] ran in between (and mca_rcache_grdma_invalidate_range
 *   cannot see a registration not yet inserted). Line numbers not pinned:
 *   the 4.1.4 sources are not installed here; function names and statements
 *   checked against open-mpi/ompi's file.
 *
 * Build: OMPI=/usr/lib/x86_64-linux-gnu/openmpi
 *   gcc -O1 -g -Wall -I.. -I$OMPI/include/openmpi -I$OMPI/include race-register-vs-unmap.c \
 *       -L$OMPI/lib -Wl,-rpath,$OMPI/lib -lopen-pal -lpthread -o race-register-vs-unmap
 * Run: ./race-register-vs-unmap   exit 1 and a STALE line: the bug; 0: fixed.
 * The same scenario through libmrcache: ../mrcache/race-register-vs-unmap.c.
 * Written for the mrcache project (conformance/reproducers). */
#define _GNU_SOURCE
#include "opal_config.h"
#include "opal/runtime/opal.h"
#include "opal/mca/base/base.h"
#include "opal/mca/rcache/rcache.h"
#include "opal/mca/rcache/base/base.h"
#if OPAL_MAJOR_VERSION >= 5
#include "opal/mca/threads/thread_usage.h" /* moved in Open MPI 5 */
#else
#include "opal/threads/thread_usage.h"
#endif
#include "uring_reg.h"
#include <semaphore.h>

typedef struct {
	mca_rcache_base_registration_t super;
	int slot; /* the io_uring fixed buffer: our "MR" */
} my_reg_t;

#define RW (MCA_RCACHE_ACCESS_LOCAL_WRITE | MCA_RCACHE_ACCESS_REMOTE_READ | MCA_RCACHE_ACCESS_REMOTE_WRITE)
#define LEN 8192

static sem_t pinned, go;
static __thread int pause_after_pin;

static int my_register_mem(void *reg_data, void *base, size_t size, mca_rcache_base_registration_t *reg)
{
	int s = ur_reg(base, size);
	(void)reg_data;
	if (s < 0)
		return OPAL_ERR_OUT_OF_RESOURCE;
	((my_reg_t *)reg)->slot = s;
	printf("register_mem  [%p, +%zu) -> slot %d\n", base, size, s);
	if (pause_after_pin) {
		pause_after_pin = 0;
		sem_post(&pinned);
		sem_wait(&go);
	}
	return OPAL_SUCCESS;
}

static int my_deregister_mem(void *reg_data, mca_rcache_base_registration_t *reg)
{
	(void)reg_data;
	printf("deregister_mem slot %d\n", ((my_reg_t *)reg)->slot);
	ur_dereg(((my_reg_t *)reg)->slot);
	return OPAL_SUCCESS;
}

static mca_rcache_base_module_t *rc;

static void grdma_init(void)
{
	int argc = 1;
	char *argv0[] = { "race-register-vs-unmap", NULL }, **argv = argv0;
	mca_rcache_base_resources_t res;

	if (opal_init(&argc, &argv) != OPAL_SUCCESS || mca_base_framework_open(&opal_rcache_base_framework, 0) != OPAL_SUCCESS) {
		fprintf(stderr, "opal_init or the rcache framework failed\n");
		exit(2);
	}
	opal_set_using_threads(!getenv("GRDMA_THREADS") || atoi(getenv("GRDMA_THREADS")));
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
}

static int acquire(void *a, mca_rcache_base_registration_t **r)
{
	if (rc->rcache_register(rc, a, LEN, 0, RW, r) != OPAL_SUCCESS) {
		fprintf(stderr, "rcache_register failed\n");
		exit(2);
	}
	return ((my_reg_t *)*r)->slot;
}

static void *thread_t(void *buf)
{
	mca_rcache_base_registration_t *r;

	pause_after_pin = 1;
	printf("T: rcache_register(%p) -> slot %d\n", buf, acquire(buf, &r)); /* 1, 3 */
	rc->rcache_deregister(rc, r);
	return NULL;
}

int main(void)
{
	mca_rcache_base_registration_t *r;
	unsigned char *buf, *again;
	pthread_t t;
	int slot, st;

	setvbuf(stdout, NULL, _IOLBF, 0);
	sem_init(&pinned, 0, 0);
	sem_init(&go, 0, 0);
	ur_init();
	grdma_init();
	printf("Open MPI grdma, opal_using_threads %d\n", (int)opal_using_threads());
	buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		return 2;
	memset(buf, 0x5a, LEN);

	pthread_create(&t, NULL, thread_t, buf);
	sem_wait(&pinned);
	if (munmap(buf, LEN)) /* 2 */
		return 2;
	again = mmap(buf, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (again != buf) {
		fprintf(stderr, "could not map %p anew\n", (void *)buf);
		return 2;
	}
	memset(buf, 0x77, LEN);
	printf("main: munmap(%p) returned, mapped anew\n", (void *)buf);
	sem_post(&go);
	pthread_join(t, NULL);

	slot = acquire(buf, &r); /* 4 */
	printf("main: rcache_register(%p) -> slot %d\n", (void *)buf, slot);
	st = ur_check_write("main, after the unmap", slot, buf, LEN, 0x11, 0xab);
	rc->rcache_deregister(rc, r);
	return st;
}
