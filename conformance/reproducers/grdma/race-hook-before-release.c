/* Open MPI 4.1.4 rcache/grdma: the memory patcher's hooks run *before*
 * munmap. A registration made between the hook and the munmap itself pins
 * frames that are about to go, is cached, and serves later rcache_register
 * calls of the range after the memory is mapped anew (P2).
 *
 * Library: Open MPI 4.1.4 (Debian bookworm libopenmpi-dev 4.1.4-3+b1),
 *   libopen-pal's rcache framework with the grdma component, initialised
 *   with opal_init (no mpirun); the memory patcher (opal/mca/patcher) and
 *   opal_mem_hooks are the monitor. register_mem/deregister_mem are ours and
 *   pin with io_uring fixed buffers (../uring_reg.h), as a BTL's would with
 *   ibv_reg_mr. opal_set_using_threads(true) as under MPI_THREAD_MULTIPLE
 *   (GRDMA_THREADS=0: false; it fails the same way).
 *
 * Sequence (two threads; the interleaving is forced with semaphores, no
 * timing involved):
 *   1. main: rcache_register(buf, 8 KiB) -> R1; rcache_deregister: cached.
 *   2. thread U: munmap(buf). The patcher's munmap calls the release hooks:
 *      grdma's (mca_rcache_base_mem_cb) marks R1 invalid; then a release
 *      callback of ours, registered after grdma's, holds U there, after grdma
 *      has seen the event and before the munmap syscall. (Without ours the
 *      window exists, only short: any thread preempted there opens it.)
 *   3. main: rcache_register(buf) -> a miss: register_mem pins the frames
 *      still mapped at buf; grdma caches R2; rcache_deregister.
 *   4. U continues: the munmap syscall runs and returns; R2 now pins frames
 *      the process no longer maps.
 *   5. main: mmap(buf) anew; rcache_register(buf) -> R2 (a hit). The "NIC"
 *      writes 0xAB through R2 (IORING_OP_READ_FIXED into R2's fixed buffer).
 * Expected: the acquire of step 5 began after the munmap returned, so it must
 *   get a registration of the frames mapped now: a registration made while
 *   an unmap of its range is in progress must not stay cached past it (the
 *   kernel's answer: invalidate_range_start/_end).
 * Observed: step 5 hits R2; the device's bytes go to the freed frames:
 *     STALE: main, after the unmap: the device wrote 0xab x 8192 through ...
 * Responsible: the patched munmap, _intercept_munmap in
 *   opal/mca/memory/patcher/memory_patcher_component.c, calls
 *   opal_mem_hooks_release_hook(start, length, true) and then the munmap
 *   syscall (memory_patcher_syscall(SYS_munmap, ...)); there is no hook after it.
 *   grdma (opal/mca/rcache/grdma/rcache_grdma_module.c,
 *   mca_rcache_grdma_register) registers and inserts R2 with nothing that
 *   records that an unmap of [base, bound] is in progress. Line numbers not
 *   pinned: the 4.1.4 sources are not installed here; function names checked
 *   against open-mpi/ompi.
 *
 * Build: OMPI=/usr/lib/x86_64-linux-gnu/openmpi
 *   gcc -O1 -g -Wall -I.. -I$OMPI/include/openmpi -I$OMPI/include race-hook-before-release.c \
 *       -L$OMPI/lib -Wl,-rpath,$OMPI/lib -lopen-pal -lpthread -o race-hook-before-release
 * Run: ./race-hook-before-release   exit 1 and a STALE line: the bug; 0: fixed.
 * The same scenario through libmrcache: ../mrcache/race-hook-before-release.c.
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
#include "opal/memoryhooks/memory.h"
#include "uring_reg.h"
#include <semaphore.h>

typedef struct {
	mca_rcache_base_registration_t super;
	int slot; /* the io_uring fixed buffer: our "MR" */
} my_reg_t;

#define RW (MCA_RCACHE_ACCESS_LOCAL_WRITE | MCA_RCACHE_ACCESS_REMOTE_READ | MCA_RCACHE_ACCESS_REMOTE_WRITE)
#define LEN 8192

static sem_t hooked, go;
static __thread int pause_in_hook;

static int my_register_mem(void *reg_data, void *base, size_t size, mca_rcache_base_registration_t *reg)
{
	int s = ur_reg(base, size);
	(void)reg_data;
	if (s < 0)
		return OPAL_ERR_OUT_OF_RESOURCE;
	((my_reg_t *)reg)->slot = s;
	printf("register_mem  [%p, +%zu) -> slot %d\n", base, size, s);
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

/* Runs after grdma's release callback, before the syscall. */
static void after_grdma_hook(void *buf, size_t length, void *cbdata, bool from_alloc)
{
	(void)length, (void)cbdata, (void)from_alloc;
	if (!pause_in_hook)
		return;
	pause_in_hook = 0;
	printf("U: release hook for %p: grdma's callback has run, the munmap has not\n", buf);
	sem_post(&hooked);
	sem_wait(&go);
}

static void grdma_init(void)
{
	int argc = 1;
	char *argv0[] = { "race-hook-before-release", NULL }, **argv = argv0;
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
	if (opal_mem_hooks_register_release(after_grdma_hook, NULL) != OPAL_SUCCESS) {
		fprintf(stderr, "opal_mem_hooks_register_release failed\n");
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

static void *thread_u(void *buf)
{
	pause_in_hook = 1;
	if (munmap(buf, LEN)) /* 2, 4 */
		perror("munmap");
	printf("U: munmap(%p) returned\n", buf);
	return NULL;
}

int main(void)
{
	mca_rcache_base_registration_t *r;
	unsigned char *buf, *again;
	pthread_t u;
	int slot, st;

	setvbuf(stdout, NULL, _IOLBF, 0);
	sem_init(&hooked, 0, 0);
	sem_init(&go, 0, 0);
	ur_init();
	grdma_init();
	printf("Open MPI grdma, opal_using_threads %d\n", (int)opal_using_threads());
	buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		return 2;
	memset(buf, 0x5a, LEN);

	slot = acquire(buf, &r); /* 1 */
	rc->rcache_deregister(rc, r);

	pthread_create(&u, NULL, thread_u, buf);
	sem_wait(&hooked);
	slot = acquire(buf, &r); /* 3 */
	printf("main: rcache_register(%p) during the unmap -> slot %d\n", (void *)buf, slot);
	rc->rcache_deregister(rc, r);
	sem_post(&go);
	pthread_join(u, NULL);

	again = mmap(buf, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0); /* 5 */
	if (again != buf) {
		fprintf(stderr, "could not map %p anew\n", (void *)buf);
		return 2;
	}
	memset(buf, 0x77, LEN);
	slot = acquire(buf, &r);
	printf("main: rcache_register(%p) after the unmap -> slot %d\n", (void *)buf, slot);
	st = ur_check_write("main, after the unmap", slot, buf, LEN, 0x11, 0xab);
	rc->rcache_deregister(rc, r);
	return st;
}
