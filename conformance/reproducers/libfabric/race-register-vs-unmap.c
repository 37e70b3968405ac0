/* libfabric 1.17.0 util MR cache: memory unmapped (and mapped anew) while
 * another thread's registration of it is in progress: the cache inserts the
 * registration of the old frames, and later searches of the range hit it (P2).
 *
 * Library: libfabric 1.17.0 (tag v1.17.0, commit 4a7d3ad0), the util MR
 *   cache prov/util/src/util_mr_cache.c with its memory monitors: memhooks by
 *   default; FI_MR_CACHE_MONITOR=userfaultfd fails the same way. Built outside
 *   libfabric as the conformance adapter is (run.sh; config.h and lf_stubs.c
 *   from ../../adapters/libfabric stand in for configure and the core).
 *   add_region/delete_region are ours: they pin with io_uring fixed buffers
 *   (../uring_reg.h), as a provider's would with ibv_reg_mr.
 *
 * Sequence (two threads; the interleaving is forced with semaphores):
 *   1. thread T: ofi_mr_cache_search(buf, 8 KiB): a miss; util_mr_cache_create
 *      drops mm_lock and calls add_region, which pins the frames behind buf
 *      and then waits (a slow ibv_reg_mr, or T preempted).
 *   2. main: munmap(buf) returns (the monitor's notification finds nothing to
 *      invalidate: the entry is not in the tree yet); mmap(buf) anew.
 *   3. T: add_region returns; the cache inserts entry E1 (the old frames) and
 *      subscribes it to the monitor; T releases it (ofi_mr_cache_delete): E1
 *      stays cached.
 *   4. main: ofi_mr_cache_search(buf) -> E1 (a hit). The "NIC" writes 0xAB
 *      through E1 (IORING_OP_READ_FIXED into E1's fixed buffer); main reads buf.
 * Expected: the search of step 4 began after the munmap returned, so it must
 *   get a registration of the frames mapped now: an entry whose range was
 *   invalidated while add_region ran must not be inserted (the kernel's answer
 *   is mmu_interval_read_begin/_retry).
 * Observed: step 4 hits E1 and the device's bytes go to the freed frames:
 *     STALE: main, after the unmap: the device wrote 0xab x 8192 through ...
 * Responsible: prov/util/src/util_mr_cache.c, util_mr_cache_create, lines
 *   277-299: add_region runs without mm_lock (277), and after re-taking it
 *   (281) the only re-check is `cur = ofi_mr_rbt_find(&cache->tree, info)` for
 *   a conflicting entry (282); nothing records that the monitor notified an
 *   overlapping range in between, and the entry is inserted (292) and
 *   subscribed (300) as valid.
 * Note: T mallocs once before searching. Without that, T's first malloc would
 *   happen under mm_lock (ofi_rbnode_alloc, tree.c:59, at the insert) and
 *   glibc's set-up of T's arena munmaps, which memhooks intercepts: T would
 *   deadlock on mm_lock instead (./race-concurrent-miss.c).
 *
 * Build and run: see run.sh (it builds the cache from the libfabric sources).
 *   ./race-register-vs-unmap   exit 1 and a STALE line: the bug; 0: fixed.
 * The same scenario through libmrcache: ../mrcache/race-register-vs-unmap.c.
 * Written for the mrcache project (conformance/reproducers). */
#include "lf_prelude.h"
#include "uring_reg.h"
#include <semaphore.h>

#define LEN 8192

struct my_data { int slot; };
static struct ofi_mr_cache cache;
static struct util_domain dom;
static sem_t pinned, go;
static __thread int pause_after_pin;

static int add_region(struct ofi_mr_cache *c, struct ofi_mr_entry *e)
{
	int s = ur_reg(e->info.iov.iov_base, e->info.iov.iov_len);
	(void)c;
	if (s < 0)
		return -FI_ENOMEM;
	((struct my_data *)e->data)->slot = s;
	printf("add_region    [%p, +%zu) -> slot %d\n", e->info.iov.iov_base, e->info.iov.iov_len, s);
	if (pause_after_pin) {
		pause_after_pin = 0;
		sem_post(&pinned);
		sem_wait(&go);
	}
	return 0;
}

static void delete_region(struct ofi_mr_cache *c, struct ofi_mr_entry *e)
{
	(void)c;
	printf("delete_region slot %d\n", ((struct my_data *)e->data)->slot);
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

static void *thread_t(void *buf)
{
	struct ofi_mr_entry *e;

	free(malloc(64)); /* T's malloc arena exists before mm_lock is taken (see Note) */
	pause_after_pin = 1;
	printf("T: ofi_mr_cache_search(%p) -> slot %d\n", buf, search(buf, &e)); /* 1, 3 */
	ofi_mr_cache_delete(&cache, e);
	return NULL;
}

int main(void)
{
	struct ofi_mr_entry *e;
	unsigned char *buf, *again;
	pthread_t t;
	int slot, st;

	setvbuf(stdout, NULL, _IOLBF, 0);
	sem_init(&pinned, 0, 0);
	sem_init(&go, 0, 0);
	ur_init();
	lf_init();
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

	slot = search(buf, &e); /* 4 */
	printf("main: ofi_mr_cache_search(%p) -> slot %d\n", (void *)buf, slot);
	st = ur_check_write("main, after the unmap", slot, buf, LEN, 0x11, 0xab);
	ofi_mr_cache_delete(&cache, e);
	return st;
}
