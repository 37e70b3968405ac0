/* UCX 1.13.1 ucs_rcache: UCM's memory hooks run *before* munmap. A
 * registration made between the hook and the munmap itself pins frames that
 * are about to go, is cached, and serves later gets of the range after the
 * memory is mapped anew (P2).
 *
 * Library: UCX 1.13.1 (Debian bookworm libucx-dev/libucx0 1.13.1-1):
 *   ucs_rcache (libucs) with UCM's VM_UNMAPPED events (libucm) as its
 *   monitor, created as a transport's would (ucs_rcache_create, alignment
 *   4096, ucm_events UCM_EVENT_VM_UNMAPPED). mem_reg/mem_dereg are ours: they
 *   pin with io_uring fixed buffers (../uring_reg.h), as uct_ib_md's would
 *   with ibv_reg_mr.
 *
 * Sequence (two threads; the interleaving is forced with semaphores, no
 * timing involved):
 *   1. main: ucs_rcache_get(buf, 8 KiB) -> R1, ucs_rcache_region_put: cached.
 *   2. thread U: munmap(buf). UCM runs the VM_UNMAPPED handlers: rcache's
 *      (priority 1000) invalidates R1; then a handler of ours registered at
 *      a later priority (2000) holds U there, after rcache has seen the event
 *      and before the munmap syscall. (Without our handler the same window
 *      exists; it is just short: any thread preempted there opens it.)
 *   3. main: ucs_rcache_get(buf) -> a miss: mem_reg pins the frames still
 *      mapped at buf; the region R2 is cached; put.
 *   4. U continues: the munmap syscall runs and returns; R2 now pins frames
 *      the process no longer maps.
 *   5. main: mmap(buf) anew; ucs_rcache_get(buf) -> R2 (a hit). The "NIC"
 *      writes 0xAB through R2 (IORING_OP_READ_FIXED into R2's fixed buffer).
 * Expected: the get of step 5 began after the munmap returned, so it must get
 *   a registration of the frames mapped now: a region created while an unmap
 *   of its range is in progress must not stay cached past the unmap (the
 *   kernel's answer: invalidate_range_start/_end and a sequence count that
 *   mmu_interval_read_retry checks).
 * Observed: step 5 hits R2; the device's bytes go to the freed frames:
 *     STALE: main, after the unmap: the device wrote 0xab x 8192 through ...
 * Responsible: src/ucm/event/event.c, ucm_munmap: ucm_dispatch_vm_munmap(addr,
 *   length) (the VM_UNMAPPED handlers, rcache's ucs_rcache_unmapped_callback
 *   among them) runs before ucm_event_dispatch(UCM_EVENT_MUNMAP, ...) makes
 *   the syscall, and there is no event after it. src/ucs/memory/rcache.c:
 *   ucs_rcache_unmapped_callback only queues [start, end) on inv_q; the next
 *   get applies it (ucs_rcache_check_inv_queue) and then creates and inserts
 *   a region of the same range (ucs_rcache_create_region), with nothing that
 *   records that the unmap has not happened yet. Line numbers not pinned:
 *   UCX's sources are not installed here; statements checked against
 *   openucx/ucx's event.c and rcache.c.
 *
 * Build: gcc -O1 -g -Wall -I.. race-hook-before-release.c -lucs -lucm -lpthread -o race-hook-before-release
 *   (UCX 1.22.0: add -DUCX_VERSION_NUM=12200 and its -I/-L/-rpath.)
 * Run: ./race-hook-before-release   exit 1 and a STALE line: the bug; 0: fixed.
 * The same scenario through libmrcache: ../mrcache/race-hook-before-release.c.
 * Written for the mrcache project (conformance/reproducers). */
#define _GNU_SOURCE
#include <ucs/memory/rcache.h>
#include <ucm/api/ucm.h>
#include <ucs/type/status.h>
#include "uring_reg.h"
#include <limits.h>
#include <semaphore.h>

#define LEN 8192

/* UCX 1.22.0 (run.sh passes UCX_VERSION_NUM=12200) moved the alignment from
 * the params to ucs_rcache_get. */
#ifndef UCX_VERSION_NUM
#define UCX_VERSION_NUM 11301
#endif

typedef struct {
	ucs_rcache_region_t super; /* must be first */
	int slot;                  /* the io_uring fixed buffer: our "MR" */
} my_region_t;

static ucs_rcache_t *rc;
static sem_t hooked, go;
static __thread int pause_in_hook;

static ucs_status_t my_reg(void *ctx, ucs_rcache_t *c, void *arg, ucs_rcache_region_t *r, uint16_t flags)
{
	int s = ur_reg((void *)r->super.start, r->super.end - r->super.start);
	(void)ctx, (void)c, (void)arg, (void)flags;
	if (s < 0)
		return UCS_ERR_NO_RESOURCE;
	((my_region_t *)r)->slot = s;
	printf("mem_reg   [0x%lx, +%lu) -> slot %d\n", (unsigned long)r->super.start, (unsigned long)(r->super.end - r->super.start), s);
	return UCS_OK;
}

static void my_dereg(void *ctx, ucs_rcache_t *c, ucs_rcache_region_t *r)
{
	(void)ctx, (void)c;
	printf("mem_dereg slot %d\n", ((my_region_t *)r)->slot);
	ur_dereg(((my_region_t *)r)->slot);
}

static void my_dump(void *ctx, ucs_rcache_t *c, ucs_rcache_region_t *r, char *buf, size_t max)
{
	(void)ctx, (void)c;
	snprintf(buf, max, "slot=%d", ((my_region_t *)r)->slot);
}

#if UCX_VERSION_NUM >= 12200
/* 1.22.0 calls ops->merge, unchecked, for each region a get merges with;
 * there is nothing of ours to carry over. */
static void my_merge(void *ctx, ucs_rcache_t *c, void *arg, ucs_rcache_region_t *r)
{
	(void)ctx, (void)c, (void)arg, (void)r;
}
static ucs_rcache_ops_t ops = { .mem_reg = my_reg, .mem_dereg = my_dereg, .merge = my_merge, .dump_region = my_dump };
#else
static ucs_rcache_ops_t ops = { .mem_reg = my_reg, .mem_dereg = my_dereg, .dump_region = my_dump };
#endif

/* Runs after rcache's VM_UNMAPPED handler, before the syscall. */
static void after_rcache_hook(ucm_event_type_t t, ucm_event_t *e, void *arg)
{
	(void)t, (void)arg;
	if (!pause_in_hook)
		return;
	pause_in_hook = 0;
	printf("U: UCM VM_UNMAPPED for %p: rcache's handler has run, the munmap has not\n", e->vm_unmapped.address);
	sem_post(&hooked);
	sem_wait(&go);
}

static void ucx_init(void)
{
	ucs_rcache_params_t p;

	memset(&p, 0, sizeof(p));
	p.region_struct_size = sizeof(my_region_t);
#if UCX_VERSION_NUM < 12200
	p.alignment = 4096;
	p.max_alignment = 4096;
#endif
	p.ucm_events = UCM_EVENT_VM_UNMAPPED;
	p.ucm_event_priority = 1000;
	p.ops = &ops;
	p.max_regions = ULONG_MAX;
	p.max_size = SIZE_MAX;
	p.max_unreleased = SIZE_MAX;
	if (ucs_rcache_create(&p, "repro", NULL, &rc) != UCS_OK ||
	    ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED, 2000, after_rcache_hook, NULL) != UCS_OK) {
		fprintf(stderr, "ucs_rcache_create or ucm_set_event_handler failed\n");
		exit(2);
	}
}

static int get(void *a, ucs_rcache_region_t **r)
{
#if UCX_VERSION_NUM >= 12200
	if (ucs_rcache_get(rc, a, LEN, 4096, PROT_READ | PROT_WRITE, NULL, r) != UCS_OK) {
#else
	if (ucs_rcache_get(rc, a, LEN, PROT_READ | PROT_WRITE, NULL, r) != UCS_OK) {
#endif
		fprintf(stderr, "ucs_rcache_get failed\n");
		exit(2);
	}
	return ((my_region_t *)*r)->slot;
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
	ucs_rcache_region_t *r;
	unsigned char *buf, *again;
	pthread_t u;
	int slot, st;

	setvbuf(stdout, NULL, _IOLBF, 0);
	sem_init(&hooked, 0, 0);
	sem_init(&go, 0, 0);
	ur_init();
	ucx_init();
	buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		return 2;
	memset(buf, 0x5a, LEN);

	slot = get(buf, &r); /* 1 */
	ucs_rcache_region_put(rc, r);

	pthread_create(&u, NULL, thread_u, buf);
	sem_wait(&hooked);
	slot = get(buf, &r); /* 3 */
	printf("main: ucs_rcache_get(%p) during the unmap -> slot %d\n", (void *)buf, slot);
	ucs_rcache_region_put(rc, r);
	sem_post(&go);
	pthread_join(u, NULL);

	again = mmap(buf, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0); /* 5 */
	if (again != buf) {
		fprintf(stderr, "could not map %p anew\n", (void *)buf);
		return 2;
	}
	memset(buf, 0x77, LEN);
	slot = get(buf, &r);
	printf("main: ucs_rcache_get(%p) after the unmap -> slot %d\n", (void *)buf, slot);
	st = ur_check_write("main, after the unmap", slot, buf, LEN, 0x11, 0xab);
	ucs_rcache_region_put(rc, r);
	return st;
}
