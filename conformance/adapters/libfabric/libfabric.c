/* Conformance adapter for libfabric 1.17.0's util MR cache (ofi_mr_cache_*),
 * built outside libfabric as shared/peers/probes/libfabric does: its
 * sources come from LIBFABRIC_SRC at build time (never copied here);
 * config.h and lf_stubs.c beside this file stand in for configure and the
 * rest of libfabric. Written for this project; see
 * docs/conformance-protocol.md.
 *
 * Registrations pin through the shared io_uring registrar of adapter.c
 * (`--registrar counting`: report only), before or after `--uffd`.
 * The cache has no access field (we register everything) and is byte
 * granular (we round requests out to pages). Its monitor is memhooks by
 * default, userfaultfd with `--uffd` (FI_MR_CACHE_MONITOR). memhooks runs
 * its hook inside the intercepted call, before the syscall, with no way to
 * add ours after it: `pause_mem` only with userfaultfd, whose events come
 * after the release. */
#ifdef LF_FULL_LIBRARY
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* libfabric's headers need it; its config.h does not set it */
#endif
/* A whole libfabric (conformance/upstream/build.sh: libfabric.a and its
 * configure's config.h, passed with -include): its own fi_param_get, hmem
 * and monitor start-up (fi_ini) replace lf_stubs.c. */
#else
#include "config.h"
#endif
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ofi_util.h>
#include <ofi_mr.h>
#include "../adapter.h"
#include "../leases.h"

#ifdef LF_FULL_LIBRARY
void fi_ini(void); /* libfabric's start-up (src/fabric.c); no header declares it */
#endif

struct my_data { uint64_t id; };
static struct ofi_mr_cache cache;
static struct util_domain dom;
static int uffd;

static int add_region(struct ofi_mr_cache *c, struct ofi_mr_entry *e)
{
	((struct my_data *)e->data)->id = adapter_reg((uint64_t)e->info.iov.iov_base, e->info.iov.iov_len, 0xf);
	return ((struct my_data *)e->data)->id ? 0 : -EIO; /* 0: the registrar could not pin */
}

static void delete_region(struct ofi_mr_cache *c, struct ofi_mr_entry *e)
{
	if (((struct my_data *)e->data)->id)
		adapter_dereg(((struct my_data *)e->data)->id);
}

static int cache_live;

static int create(char *err, size_t errn)
{
	struct ofi_mem_monitor *monitors[OFI_HMEM_MAX] = { NULL };
	int ret;

	if (cache_live)
		return 0;
	memset(&cache, 0, sizeof(cache));
	cache.entry_data_size = sizeof(struct my_data);
	cache.add_region = add_region;
	cache.delete_region = delete_region;
	monitors[FI_HMEM_SYSTEM] = default_monitor;
	ret = ofi_mr_cache_init(&dom, monitors, &cache);
	if (ret) {
		snprintf(err, errn, "ofi_mr_cache_init: %d", ret);
		return EIO;
	}
	cache_live = 1;
	return 0;
}

/* The last cache's cleanup stops the monitor (memhooks: unpatches the
 * intercepted calls; userfaultfd: stops its thread); the next init starts
 * it again. */
static int destroy(char *err, size_t errn)
{
	if (cache_live)
		ofi_mr_cache_cleanup(&cache);
	cache_live = 0;
	lease_orphan_all();
	return 0;
}

static int init(unsigned long max_regions, unsigned long max_bytes, char *limits, size_t n, char *err, size_t errn)
{
	struct ofi_mem_monitor *monitors[OFI_HMEM_MAX] = { NULL };
	int ret;

	setenv("FI_MR_CACHE_MONITOR", uffd ? "userfaultfd" : "memhooks", 1);
#ifdef LF_FULL_LIBRARY
	fi_ini(); /* reads FI_MR_CACHE_MONITOR in ofi_monitors_init */
#else
	ofi_monitors_init();
#endif
	if (max_regions)
		cache_params.max_cnt = max_regions;
	if (max_bytes)
		cache_params.max_size = max_bytes;
	memset(&dom, 0, sizeof(dom));
	dom.prov = &core_prov;
	ofi_atomic_initialize32(&dom.ref, 0);
	memset(&cache, 0, sizeof(cache));
	cache.entry_data_size = sizeof(struct my_data);
	cache.add_region = add_region;
	cache.delete_region = delete_region;
	monitors[FI_HMEM_SYSTEM] = default_monitor;
	ret = ofi_mr_cache_init(&dom, monitors, &cache);
	if (ret) {
		snprintf(err, errn, "ofi_mr_cache_init: %d", ret);
		return -1;
	}
	cache_live = 1;
	snprintf(limits, n, "{\"max_regions\":%zu,\"max_pinned_bytes\":%zu}", cache_params.max_cnt, cache_params.max_size);
	return 0;
}

static int acquire(uint64_t lease, uint64_t addr, uint64_t len, unsigned access, uint64_t *reg, char *err, size_t errn)
{
	struct ofi_mr_info info;
	struct ofi_mr_entry *e = NULL;
	uint64_t first = addr & ~4095ul, end = (addr + len + 4095) & ~4095ul;
	int ret;

	memset(&info, 0, sizeof(info));
	info.iov.iov_base = (void *)first;
	info.iov.iov_len = end - first;
	info.iface = FI_HMEM_SYSTEM;
	ret = ofi_mr_cache_search(&cache, &info, &e);
	if (ret) {
		snprintf(err, errn, "ofi_mr_cache_search: %d", ret);
		return ret < 0 ? -ret : EIO;
	}
	*reg = ((struct my_data *)e->data)->id;
	if (lease_put(lease, e)) {
		snprintf(err, errn, "too many leases");
		return EIO;
	}
	return 0;
}

static int release(uint64_t lease, char *err, size_t errn)
{
	struct ofi_mr_entry *e = lease_take(lease);
	if (!e) {
		snprintf(err, errn, "unknown lease %lu", (unsigned long)lease);
		return EINVAL;
	}
	if (e == LEASE_ORPHAN)
		return 0;
	ofi_mr_cache_delete(&cache, e);
	return 0;
}

static int flush(char *err, size_t errn)
{
	while (ofi_mr_cache_flush(&cache, true))
		;
	return 0;
}

int main(int argc, char **argv)
{
	static struct peer p = {
		.name = "libfabric-mr-cache",
		.version = PACKAGE_VERSION,
		.policy = "no-merge-uncache-contained",
		.caps = "[\"flush\",\"limits\",\"fork\",\"pause\",\"during_register\",\"fork_paused\",\"destroy\"]",
		.access_classes = "[\"local_write+remote_read+remote_write+remote_atomic\"]",
		.pause_in_hook = 0,
		.init = init,
		.acquire = acquire,
		.release = release,
		.flush = flush,
		.destroy = destroy,
		.create = create,
	};
	if (adapter_parse_args(&argc, argv))
		return 2;
	if (argc > 1 && !strcmp(argv[1], "--uffd")) {
		uffd = 1;
		p.name = "libfabric-mr-cache (userfaultfd)";
		p.caps = "[\"flush\",\"limits\",\"fork\",\"pause\",\"pause_mem\",\"during_register\",\"fork_paused\",\"destroy\"]";
	}
	return adapter_main(&p);
}
