/* libfabric 1.17.0 util MR cache: after fork(), the child's MR cache returns
 * the parent's registration, which pins the parent's frames (P2).
 *
 * Library: libfabric 1.17.0 (tag v1.17.0, commit 4a7d3ad0), the util MR
 *   cache prov/util/src/util_mr_cache.c with its memory monitors (memhooks by
 *   default, FI_MR_CACHE_MONITOR=userfaultfd also fails), built outside
 *   libfabric as the conformance adapter is (run.sh: config.h and lf_stubs.c
 *   from ../../adapters/libfabric stand in for configure and the rest of the
 *   core). add_region/delete_region are ours: they pin with io_uring fixed
 *   buffers (../uring_reg.h), as a provider's would with ibv_reg_mr.
 *
 * Sequence (one thread):
 *   1. buf = 8 KiB anonymous memory; ofi_mr_cache_search(buf) -> entry E1
 *      (add_region pins the frames behind buf); ofi_mr_cache_delete(E1):
 *      E1 stays cached.
 *   2. fork(). In the child, buf is backed by new frames (the kernel copies
 *      pinned anonymous pages into the child at fork, or at its first write);
 *      E1 keeps pinning the parent's.
 *   3. In the child: ofi_mr_cache_search(buf) -> E1 (a hit).
 *   4. The "NIC" writes 0xAB through E1 into buf (IORING_OP_READ_FIXED into
 *      E1's fixed buffer, as an RDMA write into the MR); the child reads buf.
 * Expected: the child's cache serves none of the parent's registrations; step
 *   3 misses and registers the child's frames, and the child reads 0xAB.
 * Observed: step 3 hits E1; the child reads its own 0x11 while the device's
 *   bytes went into the parent's frames (the parent's buf now reads 0xAB):
 *     STALE: child: the device wrote 0xab x 8192 through registration ...
 * Responsible: nothing in the core handles fork: no pthread_atfork in
 *   prov/util/src/util_mr_cache.c or util_mem_monitor.c, and the search hits
 *   any entry whose range covers the request and that the monitor calls valid
 *   (util_mr_cache.c:349-352 in ofi_mr_cache_search, `if (*entry &&
 *   ofi_iov_within(...) && monitor->valid(...)) goto hit;`; memhooks' and
 *   userfaultfd's valid() return true for every entry not yet invalidated).
 *   With ibv_fork_init()/RDMAV_FORK_SAFE the MR pages are MADV_DONTFORK and
 *   absent in the child; the child maps buf anew and hits E1 all the same.
 *
 * Build and run: see run.sh (it builds the cache from the libfabric sources).
 *   ./fork-cached        exit 1 and a STALE line: the bug; 0: fixed; 2: setup.
 * The same scenario through libmrcache: ../mrcache/fork-cached.c (exits 0).
 * Written for the mrcache project (conformance/reproducers). */
#include "lf_prelude.h"
#include "uring_reg.h"
#include <sys/wait.h>

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
	printf("add_region    [%p, +%zu) -> slot %d (pid %d)\n", e->info.iov.iov_base, e->info.iov.iov_len, s, (int)getpid());
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

int main(void)
{
	struct ofi_mr_entry *e;
	unsigned char *buf;
	int slot, st = 0;
	pid_t pid;

	setvbuf(stdout, NULL, _IOLBF, 0);
	ur_init();
	lf_init();
	buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		return 2;
	memset(buf, 0x5a, LEN);

	slot = search(buf, &e); /* 1 */
	if (ur_check_write("parent, before the fork", slot, buf, LEN, 0x11, 0xcd))
		return 2;
	ofi_mr_cache_delete(&cache, e);

	fflush(stdout);
	pid = fork(); /* 2 */
	if (pid < 0)
		return 2;
	if (pid == 0) {
		slot = search(buf, &e); /* 3 */
		printf("child: ofi_mr_cache_search(%p) -> slot %d\n", (void *)buf, slot);
		st = ur_check_write("child", slot, buf, LEN, 0x11, 0xab); /* 4 */
		ofi_mr_cache_delete(&cache, e);
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
