/* libfabric 1.17.0 util MR cache with the memhooks monitor: the hook runs
 * *before* the munmap syscall. A registration made between the hook and the
 * syscall pins frames that are about to go, is cached, and serves later
 * searches of the range after the memory is mapped anew (P2). (With
 * FI_MR_CACHE_MONITOR=userfaultfd the events come after the unmap and this
 * passes.)
 *
 * Library: libfabric 1.17.0 (tag v1.17.0, commit 4a7d3ad0), the util MR
 *   cache prov/util/src/util_mr_cache.c with the memhooks monitor
 *   (util_mem_hooks.c). Built outside libfabric as the conformance adapter
 *   is (run.sh; config.h and lf_stubs.c from ../../adapters/libfabric stand
 *   in for configure and the core). add_region/delete_region are ours: they
 *   pin with io_uring fixed buffers (../uring_reg.h).
 *
 * Sequence (two threads; the interleaving is forced, no timing involved):
 *   1. main: ofi_mr_cache_search(buf, 8 KiB) -> E1; ofi_mr_cache_delete:
 *      cached.
 *   2. thread U: munmap(buf). memhooks' ofi_intercept_munmap runs
 *      ofi_intercept_handler (E1 is invalidated), then makes the syscall. The
 *      syscall is held at its entry, before the kernel unmaps anything, by a
 *      seccomp user-notification filter U installed for munmap(buf) only
 *      (memhooks offers no hook after its own; this stands for U being
 *      preempted between the two).
 *   3. main (the filter's supervisor, once the notification arrives):
 *      ofi_mr_cache_search(buf) -> a miss: add_region pins the frames still
 *      mapped at buf; the entry E2 is inserted and subscribed; delete: cached.
 *   4. main lets the syscall continue (SECCOMP_USER_NOTIF_FLAG_CONTINUE): the
 *      munmap runs and returns; E2 now pins frames the process no longer maps.
 *   5. main: mmap(buf) anew; ofi_mr_cache_search(buf) -> E2 (a hit). The
 *      "NIC" writes 0xAB through E2 (IORING_OP_READ_FIXED into E2's fixed
 *      buffer); main reads buf.
 * Expected: the search of step 5 began after the munmap returned, so it must
 *   get a registration of the frames mapped now.
 * Observed: step 5 hits E2; the device's bytes go to the freed frames:
 *     STALE: main, after the unmap: the device wrote 0xab x 8192 through ...
 * Responsible: prov/util/src/util_mem_hooks.c:439-444, ofi_intercept_munmap:
 *   `ofi_intercept_handler(start, length);` (the notification, under mm_lock,
 *   420-427) and then `return ofi_memhooks_syscall(SYS_munmap, start,
 *   length);`, with mm_lock released in between and no notification after
 *   the syscall; util_mr_cache.c:257-317 (util_mr_cache_create) inserts E2
 *   with nothing that records an unmap in progress. The conformance suite
 *   lists this case as unsupported for memhooks (no place for its pause);
 *   the seccomp filter is that place.
 * Needs: seccomp user notification with SECCOMP_USER_NOTIF_FLAG_CONTINUE
 *   (Linux 5.5+); the filter is installed with no_new_privs (no privilege).
 *
 * Build and run: see run.sh (it builds the cache from the libfabric sources).
 *   ./race-hook-before-release   exit 1 and a STALE line: the bug; 0: fixed.
 * The same scenario through libmrcache: ../mrcache/race-hook-before-release.c.
 * Written for the mrcache project (conformance/reproducers). */
#include "lf_prelude.h"
#include "uring_reg.h"
#include <semaphore.h>
#include <stddef.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>

#define LEN 8192

struct my_data { int slot; };
static struct ofi_mr_cache cache;
static struct util_domain dom;
static sem_t installed;
static int notify_fd = -1;

static int add_region(struct ofi_mr_cache *c, struct ofi_mr_entry *e)
{
	int s = ur_reg(e->info.iov.iov_base, e->info.iov.iov_len);
	(void)c;
	if (s < 0)
		return -FI_ENOMEM;
	((struct my_data *)e->data)->slot = s;
	printf("add_region    [%p, +%zu) -> slot %d\n", e->info.iov.iov_base, e->info.iov.iov_len, s);
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

/* A seccomp filter on the calling thread: munmap(addr, ...) waits for the
 * supervisor (user notification); every other call is allowed. Returns the
 * notification fd. */
static int hold_munmap_of(void *addr)
{
	uint64_t a = (uint64_t)(uintptr_t)addr;
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_munmap, 0, 5),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)a, 0, 3),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0]) + 4),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)(a >> 32), 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = { sizeof(f) / sizeof(f[0]), f };

	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
		return -1;
	return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
}

static void *thread_u(void *buf)
{
	free(malloc(64)); /* U's malloc arena before any hook runs (see race-concurrent-miss.c) */
	notify_fd = hold_munmap_of(buf);
	sem_post(&installed);
	if (notify_fd < 0)
		return NULL;
	if (munmap(buf, LEN)) /* 2, 4 */
		perror("munmap");
	printf("U: munmap(%p) returned\n", buf);
	return NULL;
}

int main(void)
{
	struct seccomp_notif req;
	struct seccomp_notif_resp resp;
	struct ofi_mr_entry *e;
	unsigned char *buf, *again;
	pthread_t u;
	int slot, st;

	setvbuf(stdout, NULL, _IOLBF, 0);
	sem_init(&installed, 0, 0);
	ur_init();
	lf_init();
	buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		return 2;
	memset(buf, 0x5a, LEN);

	slot = search(buf, &e); /* 1 */
	ofi_mr_cache_delete(&cache, e);

	pthread_create(&u, NULL, thread_u, buf);
	sem_wait(&installed);
	if (notify_fd < 0) {
		fprintf(stderr, "seccomp user notification unavailable: %s\n", strerror(errno));
		return 2;
	}
	memset(&req, 0, sizeof(req));
	if (ioctl(notify_fd, SECCOMP_IOCTL_NOTIF_RECV, &req)) {
		perror("SECCOMP_IOCTL_NOTIF_RECV");
		return 2;
	}
	printf("main: U is in munmap(%p), held at the syscall's entry (after memhooks' hook, with that monitor)\n", (void *)buf);
	slot = search(buf, &e); /* 3 */
	printf("main: ofi_mr_cache_search(%p) during the unmap -> slot %d\n", (void *)buf, slot);
	ofi_mr_cache_delete(&cache, e);
	memset(&resp, 0, sizeof(resp));
	resp.id = req.id;
	resp.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE; /* 4 */
	if (ioctl(notify_fd, SECCOMP_IOCTL_NOTIF_SEND, &resp)) {
		perror("SECCOMP_IOCTL_NOTIF_SEND");
		return 2;
	}
	pthread_join(u, NULL);

	again = mmap(buf, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0); /* 5 */
	if (again != buf) {
		fprintf(stderr, "could not map %p anew (the munmap did not happen?)\n", (void *)buf);
		return 2;
	}
	memset(buf, 0x77, LEN);
	slot = search(buf, &e);
	printf("main: ofi_mr_cache_search(%p) after the unmap -> slot %d\n", (void *)buf, slot);
	st = ur_check_write("main, after the unmap", slot, buf, LEN, 0x11, 0xab);
	ofi_mr_cache_delete(&cache, e);
	return st;
}
