/* libfabric 1.17.0 util MR cache with the memhooks monitor: a thread whose
 * first malloc happens inside ofi_mr_cache_search deadlocks on mm_lock (P6).
 * This is the hang of the conformance case race-concurrent-miss, reduced: it
 * needs one new thread and one cache miss, no concurrency.
 *
 * Library: libfabric 1.17.0 (tag v1.17.0, commit 4a7d3ad0), the util MR
 *   cache prov/util/src/util_mr_cache.c with the memhooks monitor
 *   (util_mem_hooks.c; the default FI_MR_CACHE_MONITOR here). Built outside
 *   libfabric as the conformance adapter is (run.sh; config.h and lf_stubs.c
 *   from ../../adapters/libfabric stand in for configure and the core).
 *   add_region/delete_region are ours (io_uring fixed buffers, ../uring_reg.h).
 *   glibc 2.36 (Debian bookworm) malloc with its default arenas.
 *
 * Sequence:
 *   1. main: ofi_mr_cache_search(buf1) -> E1, ofi_mr_cache_delete: E1 stays
 *      cached (its tree node stays in use: the tree's free list is empty).
 *   2. main starts thread T, which has not called malloc yet. T:
 *      ofi_mr_cache_search(buf2): a miss; util_mr_cache_create takes the entry
 *      from the pool (no malloc), calls add_region, takes mm_lock and inserts
 *      the entry: ofi_rbnode_alloc mallocs the tree node (tree.c:59). That is
 *      T's first malloc: glibc creates T's arena (tcache_init -> arena_get2 ->
 *      _int_new_arena -> new_heap -> alloc_new_heap), which maps twice the
 *      heap size and munmaps the misaligned head and tail. memhooks
 *      intercepts that munmap:
 *      ofi_intercept_munmap -> ofi_intercept_handler ->
 *      pthread_mutex_lock(&mm_lock), which T already holds.
 *   3. main waits 5 s for T's search to return.
 * Expected: the search returns (a monitor's hook must not block on a lock its
 *   own thread may hold, or the cache must not allocate under it).
 * Observed: T never returns; this program prints
 *     DEADLOCK: ofi_mr_cache_search has not returned in 5 s ...
 *   and exits 1. gdb, thread T (glibc 2.36):
 *     __lll_lock_wait (futex=&mm_lock) <- ofi_intercept_handler
 *     (util_mem_hooks.c:423) <- ofi_intercept_munmap (:441) <- alloc_new_heap
 *     (arena.c:525) <- new_heap <- _int_new_arena <- arena_get2 <- tcache_init
 *     <- malloc(40) <- ofi_rbnode_alloc (tree.c:59) <- ofi_rbmap_insert
 *     (tree.c:242) <- util_mr_cache_create (util_mr_cache.c:292) <-
 *     ofi_mr_cache_search (:361).
 *   With FI_MR_CACHE_MONITOR=userfaultfd it returns.
 * Responsible: prov/util/src/util_mr_cache.c:281-292 (util_mr_cache_create
 *   holds mm_lock across ofi_rbmap_insert, which can malloc: src/tree.c:59)
 *   and prov/util/src/util_mem_hooks.c:420-427 (ofi_intercept_handler takes
 *   mm_lock, non-recursive, in every intercepted munmap, including glibc's
 *   own inside malloc). Any thread whose first allocation falls under
 *   mm_lock can hit it; glibc's new heap munmaps nothing only when the kernel
 *   happens to place its mapping already aligned to the heap size, so in a
 *   fresh process it nearly always does (5 runs out of 5 here).
 *
 * Build and run: see run.sh (it builds the cache from the libfabric sources).
 *   ./race-concurrent-miss   exit 1 and a DEADLOCK line: the bug; 0: fixed.
 * The same scenario through libmrcache: ../mrcache/race-concurrent-miss.c.
 * Written for the mrcache project (conformance/reproducers). */
#include "lf_prelude.h"
#include "uring_reg.h"
#include <semaphore.h>
#include <time.h>

#define LEN 8192

struct my_data { int slot; };
static struct ofi_mr_cache cache;
static struct util_domain dom;

static int add_region(struct ofi_mr_cache *c, struct ofi_mr_entry *e)
{
	int s = ur_reg(e->info.iov.iov_base, e->info.iov.iov_len);
	(void)c;
	if (s < 0)
		return -FI_ENOMEM;
	((struct my_data *)e->data)->slot = s;
	return 0;
}

static void delete_region(struct ofi_mr_cache *c, struct ofi_mr_entry *e)
{
	(void)c;
	ur_dereg(((struct my_data *)e->data)->slot);
}

static void lf_init(void)
{
	struct ofi_mem_monitor *monitors[OFI_HMEM_MAX] = { NULL };

	setenv("FI_MR_CACHE_MONITOR", getenv("FI_MR_CACHE_MONITOR") ? getenv("FI_MR_CACHE_MONITOR") : "memhooks", 1);
#ifdef LF_FULL_LIBRARY
	fi_ini(); /* a whole libfabric (run.sh, current release): its start-up runs ofi_monitors_init */
	on_exit(exit_now, NULL);
#else
	ofi_monitors_init();
#endif
	memset(&dom, 0, sizeof(dom));
	dom.prov = &core_prov;
	ofi_atomic_initialize32(&dom.ref, 0);
	cache.entry_data_size = sizeof(struct my_data);
	cache.add_region = add_region;
	cache.delete_region = delete_region;
	monitors[FI_HMEM_SYSTEM] = default_monitor;
	if (ofi_mr_cache_init(&dom, monitors, &cache)) {
		fprintf(stderr, "ofi_mr_cache_init failed\n");
		exit(2);
	}
	printf("libfabric 1.17.0 MR cache, monitor %s\n", getenv("FI_MR_CACHE_MONITOR"));
}

static int search(void *a, struct ofi_mr_entry **e)
{
	struct ofi_mr_info info;

	memset(&info, 0, sizeof(info));
	info.iov.iov_base = a;
	info.iov.iov_len = LEN;
	info.iface = FI_HMEM_SYSTEM;
	if (ofi_mr_cache_search(&cache, &info, e)) {
		fprintf(stderr, "ofi_mr_cache_search failed\n");
		exit(2);
	}
	return ((struct my_data *)(*e)->data)->slot;
}

static sem_t done;
static int t_slot = -1;

static void *thread_t(void *buf)
{
	struct ofi_mr_entry *e;

	t_slot = search(buf, &e); /* 2: T's first malloc happens in here */
	ofi_mr_cache_delete(&cache, e);
	sem_post(&done);
	return NULL;
}

int main(void)
{
	struct ofi_mr_entry *e;
	struct timespec until;
	unsigned char *buf;
	pthread_t t;

	setvbuf(stdout, NULL, _IOLBF, 0);
	sem_init(&done, 0, 0);
	ur_init();
	lf_init();
	buf = mmap(NULL, 2 * LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		return 2;
	memset(buf, 0x5a, 2 * LEN);

	printf("main: ofi_mr_cache_search(%p) -> slot %d\n", (void *)buf, search(buf, &e)); /* 1 */
	ofi_mr_cache_delete(&cache, e);

	pthread_create(&t, NULL, thread_t, buf + LEN);
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 5; /* 3 */
	if (sem_timedwait(&done, &until)) {
		printf("DEADLOCK: ofi_mr_cache_search(%p) in a new thread has not returned in 5 s "
		       "(its first malloc, under mm_lock, munmapped, and memhooks' munmap hook waits for mm_lock)\n",
		       (void *)(buf + LEN));
		fflush(stdout);
		_exit(1);
	}
	pthread_join(t, NULL);
	printf("ok: the search in a new thread returned (slot %d)\n", t_slot);
	return 0;
}
