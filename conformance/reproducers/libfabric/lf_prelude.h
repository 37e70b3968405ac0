/* The libfabric reproducers' common prelude: libfabric's private MR-cache
 * headers, and, against the whole library (LF_FULL_LIBRARY: libfabric
 * 2.6.0's libfabric.a), fi_ini's declaration and an exit that ends before
 * libfabric's own exit destructor. */
#ifndef LF_PRELUDE_H
#define LF_PRELUDE_H
#include "config.h"
#include <ofi_util.h>
#include <ofi_mr.h>
#ifdef LF_FULL_LIBRARY
void fi_ini(void); /* src/fabric.c; no header declares it */
/* libfabric's destructor (fi_fini) asserts that no cache is still subscribed
 * to a monitor; this program ends with its cache (and leases) in place on
 * purpose, so it ends before that destructor, with its own status. */
static void exit_now(int status, void *arg)
{
	(void)arg;
	fflush(NULL);
	_exit(status);
}
#endif
#endif
