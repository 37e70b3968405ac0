/* Conformance adapter for Open MPI's rcache/grdma (Debian libopenmpi-dev
 * 4.1.4; the same source builds against 5.0.10's opal, whose rcache API is
 * unchanged), without mpirun, initialised as the probe in
 * shared/peers/probes/ompi does (opal_init, then the rcache framework, then
 * a grdma module with our register_mem/deregister_mem, which pin through
 * the shared io_uring registrar of adapter.c, or only report with
 * `--registrar counting`). Open MPI's memory
 * patcher is its monitor. Written for this project; see
 * docs/conformance-protocol.md.
 *
 * Access: grdma's MCA_RCACHE_ACCESS_* bits are spec.md's rights.
 * Pause after the hook: a release callback of ours registered after
 * grdma's (opal's memory hooks run release callbacks in registration
 * order) pauses the releasing call after grdma has seen it. */
#define _GNU_SOURCE
#include "opal_config.h"
#include "opal/runtime/opal.h"
#include "opal/mca/base/base.h"
#include "opal/mca/rcache/rcache.h"
#include "opal/mca/rcache/base/base.h"
#include "opal/memoryhooks/memory.h"
#include "adapter.h"
#include "leases.h"
#include <errno.h>
#include <stdio.h>
#include <string.h>

/* The version the adapter reports: the one whose opal_config.h it built
 * against. */
#define STR_(x) #x
#define STR(x) STR_(x)
#define OMPI_VERSION_STR STR(OPAL_MAJOR_VERSION) "." STR(OPAL_MINOR_VERSION) "." STR(OPAL_RELEASE_VERSION)

typedef struct {
	mca_rcache_base_registration_t super;
	uint64_t id;
} my_reg_t;

static mca_rcache_base_module_t *rc;

static int my_register_mem(void *reg_data, void *base, size_t size, mca_rcache_base_registration_t *reg)
{
	((my_reg_t *)reg)->id = adapter_reg((uint64_t)base, size, reg->access_flags & 0xf);
	return ((my_reg_t *)reg)->id ? OPAL_SUCCESS : OPAL_ERROR; /* 0: the registrar could not pin */
}

static int my_deregister_mem(void *reg_data, mca_rcache_base_registration_t *reg)
{
	if (((my_reg_t *)reg)->id)
		adapter_dereg(((my_reg_t *)reg)->id);
	return OPAL_SUCCESS;
}

static void after_grdma_hook(void *buf, size_t length, void *cbdata, bool extra)
{
	adapter_hook_pause();
}

static mca_rcache_base_resources_t resources;

static int create(char *err, size_t errn)
{
	if (rc)
		return 0;
	rc = mca_rcache_base_module_create("grdma", NULL, &resources);
	if (!rc) {
		snprintf(err, errn, "mca_rcache_base_module_create(grdma) failed");
		return EIO;
	}
	return 0;
}

static int destroy(char *err, size_t errn)
{
	if (rc)
		mca_rcache_base_module_destroy(rc);
	rc = NULL;
	lease_orphan_all();
	return 0;
}

static int init(unsigned long max_regions, unsigned long max_bytes, char *limits, size_t n, char *err, size_t errn)
{
	mca_rcache_base_resources_t res;
	int argc = 1, ret;
	char *argv0[] = { "conform-ompi", NULL }, **argv = argv0;

	/* grdma has no limits: we declare none (and no `limits` capability),
	 * so the runner reports a case that needs them as unsupported. */
	(void)max_regions;
	(void)max_bytes;
	ret = opal_init(&argc, &argv);
	if (ret != OPAL_SUCCESS) {
		snprintf(err, errn, "opal_init: %d", ret);
		return -1;
	}
	ret = mca_base_framework_open(&opal_rcache_base_framework, 0);
	if (ret != OPAL_SUCCESS) {
		snprintf(err, errn, "opening the rcache framework: %d", ret);
		return -1;
	}
	memset(&res, 0, sizeof(res));
	res.cache_name = "conform";
	res.sizeof_reg = sizeof(my_reg_t);
	res.register_mem = my_register_mem;
	res.deregister_mem = my_deregister_mem;
	resources = res;
	rc = mca_rcache_base_module_create("grdma", NULL, &res);
	if (!rc) {
		snprintf(err, errn, "mca_rcache_base_module_create(grdma) failed");
		return -1;
	}
	if (opal_mem_hooks_register_release(after_grdma_hook, NULL) != OPAL_SUCCESS)
		adapter_log("could not register a release hook after grdma's");
	snprintf(limits, n, "{}");
	return 0;
}

static int acquire(uint64_t lease, uint64_t addr, uint64_t len, unsigned access, uint64_t *reg, char *err, size_t errn)
{
	mca_rcache_base_registration_t *r = NULL;
	int ret = rc->rcache_register(rc, (void *)addr, len, 0, (int32_t)access, &r);

	if (ret != OPAL_SUCCESS) {
		snprintf(err, errn, "rcache_register: %d", ret);
		return ret == OPAL_ERR_OUT_OF_RESOURCE ? ENOMEM : EIO;
	}
	*reg = ((my_reg_t *)r)->id;
	if (lease_put(lease, r)) {
		snprintf(err, errn, "too many leases");
		return EIO;
	}
	return 0;
}

static int release(uint64_t lease, char *err, size_t errn)
{
	mca_rcache_base_registration_t *r = lease_take(lease);
	if (!r) {
		snprintf(err, errn, "unknown lease %lu", (unsigned long)lease);
		return EINVAL;
	}
	if (r == LEASE_ORPHAN)
		return 0;
	rc->rcache_deregister(rc, r);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct peer p = {
		.name = "ompi-grdma",
		.version = OMPI_VERSION_STR,
		.policy = "independent",
		.caps = "[\"fork\",\"pause\",\"pause_mem\",\"during_register\",\"fork_paused\",\"destroy\"]",
		.access_classes = NULL,
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
