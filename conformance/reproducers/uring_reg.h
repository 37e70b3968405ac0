/* The io_uring registrar is shared with the conformance adapters: it lives in
 * conformance/uring_reg.h. This file keeps `#include "uring_reg.h"` with
 * -I conformance/reproducers working for the reproducers. */
#include "../uring_reg.h"
