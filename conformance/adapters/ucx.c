/* Conformance adapter for UCX's registration cache (ucs_rcache, Debian
 * libucx-dev 1.13.1), driven as the probe in shared/peers/probes/ucx does:
 * the shared io_uring registrar (adapter.c) pins each registration, or with
 * `--registrar counting` only reports it; UCM's memory hooks are UCX's own
 * monitor. Written for this project; see docs/conformance-protocol.md.
 *
 * Access: ucs_rcache knows memory protection, not rights. A request that
 * asks for any write right is a PROT_READ|PROT_WRITE get; others PROT_READ.
 * The hello declares those two access classes.
 * Versions: built against Debian's 1.13.1 by default; build.sh passes
 * UCX_VERSION_NUM (major*10000+minor*100+patch) and UCX_VERSION_STR for
 * another release. In 1.22.0 (the only later release built here, so the
 * #if tests for it) ucs_rcache_get takes the alignment, the params lose
 * alignment/max_alignment, and the LRU needs its own lock
 * (UCS_RCACHE_FLAG_NEED_LRU_LOCK) unless the caller serialises every call,
 * which this adapter does not; and ops->merge must be set.
 * Pause after the hook: a second UCM VM_UNMAPPED handler, after rcache's
 * (UCM runs handlers from low to high priority), pauses the releasing call
 * after UCX has seen the event and before the syscall. */
#define _GNU_SOURCE
#include "adapter.h"
#include "leases.h"
#include <ucs/memory/rcache.h>
#include <ucm/api/ucm.h>
#include <ucs/type/status.h>
#include <ucs/config/global_opts.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#ifndef UCX_VERSION_NUM
#define UCX_VERSION_NUM 11301
#define UCX_VERSION_STR "1.13.1"
#endif

typedef struct {
	ucs_rcache_region_t super; /* must be first */
	uint64_t id;
} my_region_t;

static ucs_rcache_t *rc;

static unsigned prot_access(int prot)
{
	return (prot & PROT_WRITE) ? (ACC_LOCAL_WRITE | ACC_REMOTE_READ | ACC_REMOTE_WRITE | ACC_REMOTE_ATOMIC) : ACC_REMOTE_READ;
}

static ucs_status_t my_reg(void *ctx, ucs_rcache_t *c, void *arg, ucs_rcache_region_t *r, uint16_t flags)
{
	my_region_t *m = (my_region_t *)r;
	m->id = adapter_reg(r->super.start, r->super.end - r->super.start, prot_access(r->prot));
	return m->id ? UCS_OK : UCS_ERR_IO_ERROR; /* 0: the registrar could not pin */
}

static void my_dereg(void *ctx, ucs_rcache_t *c, ucs_rcache_region_t *r)
{
	if (((my_region_t *)r)->id)
		adapter_dereg(((my_region_t *)r)->id);
}

static void my_dump(void *ctx, ucs_rcache_t *c, ucs_rcache_region_t *r, char *buf, size_t max)
{
	snprintf(buf, max, "id=%lu", (unsigned long)((my_region_t *)r)->id);
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

static void after_rcache_hook(ucm_event_type_t t, ucm_event_t *e, void *arg)
{
	adapter_hook_pause();
}

static ucs_rcache_params_t params;

static int create(char *err, size_t errn)
{
	ucs_status_t st;

	if (rc)
		return 0;
	st = ucs_rcache_create(&params, "conform", NULL, &rc);
	if (st != UCS_OK) {
		snprintf(err, errn, "ucs_rcache_create: %s", ucs_status_string(st));
		return EIO;
	}
	return 0;
}

static int destroy(char *err, size_t errn)
{
	if (rc)
		ucs_rcache_destroy(rc);
	rc = NULL;
	lease_orphan_all();
	return 0;
}

static int init(unsigned long max_regions, unsigned long max_bytes, char *limits, size_t n, char *err, size_t errn)
{
	ucs_rcache_params_t p;
	ucs_status_t st;

	memset(&p, 0, sizeof(p));
	p.region_struct_size = sizeof(my_region_t);
#if UCX_VERSION_NUM < 12200
	p.alignment = 4096;
	p.max_alignment = 4096;
#endif
	p.ucm_events = UCM_EVENT_VM_UNMAPPED;
	p.ucm_event_priority = 1000;
	p.ops = &ops;
	p.flags = UCS_RCACHE_FLAG_PURGE_ON_FORK;
#if UCX_VERSION_NUM >= 12200
	p.flags |= UCS_RCACHE_FLAG_NEED_LRU_LOCK;
#endif
	p.max_regions = max_regions ? max_regions : ULONG_MAX;
	p.max_size = max_bytes ? max_bytes : SIZE_MAX;
	p.max_unreleased = SIZE_MAX;
	params = p;
	st = ucs_rcache_create(&p, "conform", NULL, &rc);
	if (st != UCS_OK) {
		snprintf(err, errn, "ucs_rcache_create: %s", ucs_status_string(st));
		return -1;
	}
	st = ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED, 2000, after_rcache_hook, NULL);
	if (st != UCS_OK) {
		snprintf(err, errn, "ucm_set_event_handler: %s", ucs_status_string(st));
		return -1;
	}
	snprintf(limits, n, "{\"max_regions\":%s%lu,\"max_pinned_bytes\":%s%lu}", "", max_regions, "", max_bytes);
	if (!max_regions && !max_bytes)
		snprintf(limits, n, "{}");
	else if (!max_bytes)
		snprintf(limits, n, "{\"max_regions\":%lu}", max_regions);
	else if (!max_regions)
		snprintf(limits, n, "{\"max_pinned_bytes\":%lu}", max_bytes);
	return 0;
}

static int acquire(uint64_t lease, uint64_t addr, uint64_t len, unsigned access, uint64_t *reg, char *err, size_t errn)
{
	ucs_rcache_region_t *r = NULL;
	int prot = PROT_READ | ((access & (ACC_LOCAL_WRITE | ACC_REMOTE_WRITE | ACC_REMOTE_ATOMIC)) ? PROT_WRITE : 0);
#if UCX_VERSION_NUM >= 12200
	ucs_status_t st = ucs_rcache_get(rc, (void *)addr, len, 4096, prot, NULL, &r);
#else
	ucs_status_t st = ucs_rcache_get(rc, (void *)addr, len, prot, NULL, &r);
#endif

	if (st != UCS_OK) {
		snprintf(err, errn, "ucs_rcache_get: %s", ucs_status_string(st));
		return st == UCS_ERR_NO_MEMORY ? ENOMEM : EIO;
	}
	*reg = ((my_region_t *)r)->id;
	if (lease_put(lease, r)) {
		snprintf(err, errn, "too many leases");
		return EIO;
	}
	return 0;
}

static int release(uint64_t lease, char *err, size_t errn)
{
	ucs_rcache_region_t *r = lease_take(lease);
	if (!r) {
		snprintf(err, errn, "unknown lease %lu", (unsigned long)lease);
		return EINVAL;
	}
	if (r == LEASE_ORPHAN)
		return 0;
	ucs_rcache_region_put(rc, r);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct peer p = {
		.name = "ucx-rcache",
		.version = UCX_VERSION_STR,
		.policy = "merge",
		.caps = "[\"limits\",\"fork\",\"pause\",\"pause_mem\",\"during_register\",\"fork_paused\",\"destroy\"]",
		.access_classes = "[\"remote_read\",\"local_write+remote_read+remote_write+remote_atomic\"]",
		.pause_in_hook = 1,
		.init = init,
		.acquire = acquire,
		.release = release,
		.destroy = destroy,
		.create = create,
	};
	if (adapter_parse_args(&argc, argv))
		return 2;
	return adapter_main(&p);
}
