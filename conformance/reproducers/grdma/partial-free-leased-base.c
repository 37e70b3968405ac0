/* Open MPI 4.1.4 rcache/grdma: freeing the first page of a buffer whose
 * registration is in use ends the process: `_exit(1)` inside munmap (spec
 * S5.3: the job must not abort). Freeing its second page does not.
 *
 * Library: Open MPI 4.1.4 (Debian bookworm libopenmpi-dev 4.1.4-3+b1),
 *   libopen-pal's rcache framework with the grdma component, initialised
 *   with opal_init (no mpirun); the memory patcher is the monitor.
 *   register_mem/deregister_mem are ours and pin with io_uring fixed buffers
 *   (../uring_reg.h), as a BTL's would with ibv_reg_mr.
 *
 * Sequence (one thread; the scenario runs in a child process so that this
 * program can report how it ended):
 *   1. buf = 16 KiB; rcache_register(buf, 16 KiB) -> R1 (lease L1).
 *   2. munmap(buf, 4 KiB): the first page only, while L1 is held (a
 *      partial free: an allocator returning the head of a block, a guard page).
 *   3. (expected) rcache_register(buf + 4 KiB, 4 KiB) -> L2; deregister L1
 *      and L2; mmap(buf, 4 KiB) anew; rcache_register(buf, 16 KiB) -> a
 *      registration of the frames mapped now; the "NIC" writes 0xAB through
 *      it and the application reads it.
 * Expected (spec S5.3): R1 leaves the lookup at once, stays registered until
 *   L1 is released, then is deregistered once; the job goes on.
 * Observed: munmap does not return. grdma prints
 *     [(null):PID] Attempt to free memory that is still in use by an ongoing
 *     MPI communication (buffer 0x..., size 4096).  MPI job will now abort.
 *   and the process ends with status 1 inside munmap; this program prints
 *     ABORT: ... and exits 1.
 *   With step 2 on the second page (munmap(buf + 4 KiB, 4 KiB)) grdma only
 *   invalidates R1 and the job goes on (partial-free-leased-inside passes).
 * Responsible: opal/mca/rcache/grdma/rcache_grdma_module.c, gc_add:
 *   `if (grdma_reg->ref_count && grdma_reg->base == args->base) { ... return
 *   OPAL_ERROR; }` ("to handle cases where part of an active registration has
 *   been unmapped we check if the bases match"; a partial unmap that starts
 *   at the base is still caught), and opal/mca/rcache/base/rcache_base_mem_cb.c,
 *   mca_rcache_base_mem_cb: on that error, prints the message and calls
 *   _exit(1). Line numbers not pinned: the 4.1.4 sources are not installed
 *   here; statements checked against open-mpi/ompi's files.
 *
 * Build: OMPI=/usr/lib/x86_64-linux-gnu/openmpi
 *   gcc -O1 -g -Wall -I.. -I$OMPI/include/openmpi -I$OMPI/include partial-free-leased-base.c \
 *       -L$OMPI/lib -Wl,-rpath,$OMPI/lib -lopen-pal -o partial-free-leased-base
 * Run: ./partial-free-leased-base   exit 1 and an ABORT line: the bug; 0: fixed.
 * The same scenario through libmrcache: ../mrcache/partial-free-leased-base.c.
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
#define LEN 16384
#define PAGE 4096

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

static void grdma_init(void)
{
	int argc = 1;
	char *argv0[] = { "partial-free-leased-base", NULL }, **argv = argv0;
	mca_rcache_base_resources_t res;

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
}

static int acquire(void *a, size_t len, mca_rcache_base_registration_t **r)
{
	if (rc->rcache_register(rc, a, len, 0, RW, r) != OPAL_SUCCESS) {
		fprintf(stderr, "rcache_register failed\n");
		exit(2);
	}
	return ((my_reg_t *)*r)->slot;
}

/* The scenario; `returned` gets a byte once munmap has returned. */
static int scenario(int returned)
{
	mca_rcache_base_registration_t *l1, *l2, *l3;
	unsigned char *buf, *again;
	int slot, st;

	ur_init();
	grdma_init();
	buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		return 2;
	memset(buf, 0x5a, LEN);

	acquire(buf, LEN, &l1); /* 1 */
	printf("munmap(%p, %d): the first page of a leased registration\n", (void *)buf, PAGE);
	if (munmap(buf, PAGE)) /* 2 */
		return 2;
	if (write(returned, "r", 1) != 1)
		return 2;
	printf("munmap returned\n");
	acquire(buf + PAGE, PAGE, &l2); /* 3 */
	rc->rcache_deregister(rc, l1);
	rc->rcache_deregister(rc, l2);
	again = mmap(buf, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (again != buf)
		return 2;
	slot = acquire(buf, LEN, &l3);
	st = ur_check_write("after the partial unmap", slot, buf, LEN, 0x11, 0xab);
	rc->rcache_deregister(rc, l3);
	return st;
}

int main(void)
{
	int p[2], st = 0;
	char c;
	pid_t pid;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (pipe(p))
		return 2;
	pid = fork();
	if (pid == 0) {
		close(p[0]);
		st = scenario(p[1]);
		fflush(stdout);
		_exit(st);
	}
	close(p[1]);
	if (pid < 0 || waitpid(pid, &st, 0) != pid)
		return 2;
	if (read(p[0], &c, 1) != 1) {
		printf("ABORT: the process ended inside munmap (%s %d) of memory whose registration is leased\n",
		       WIFEXITED(st) ? "exit status" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
		return 1;
	}
	return WIFEXITED(st) ? WEXITSTATUS(st) : 2;
}
