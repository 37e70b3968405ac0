/* The protocol plumbing shared by the C conformance adapters
 * (docs/conformance-protocol.md): the reader loop, one worker thread per
 * case thread, pause/continue, fork, and the memory operations. A peer
 * adapter fills in a `struct peer` and calls adapter_main().
 *
 * A peer's registrar callbacks call adapter_reg() (which reports the call
 * and pauses there when the running acquire asked to) and adapter_dereg(). */
#ifndef CONFORM_ADAPTER_H
#define CONFORM_ADAPTER_H

#include <stdint.h>
#include <stddef.h>

/* Access rights, as in spec.md S1.4 (local read implied). */
#define ACC_LOCAL_WRITE   1u
#define ACC_REMOTE_READ   2u
#define ACC_REMOTE_WRITE  4u
#define ACC_REMOTE_ATOMIC 8u

struct peer {
	const char *name;
	const char *version;
	const char *policy;         /* S6.1 name, or NULL: none declared */
	const char *caps;           /* JSON array text, e.g. "[\"flush\",\"pause\"]" */
	const char *access_classes; /* JSON array text or NULL (exact access) */
	int pause_in_hook;          /* the peer's hook calls adapter_hook_pause() */
	/* The chunk every registration is widened to, in bytes (the hello's
	 * `chunk_size`); 0: one page. */
	unsigned long chunk_size;
	/* Called once with the limits the case asks for (0: none). Fills
	 * `limits_json` with what is in force ({"max_regions":..}). Returns 0 or
	 * writes `err`. */
	int (*init)(unsigned long max_regions, unsigned long max_bytes, char *limits_json, size_t n, char *err, size_t errn);
	/* Returns 0 and the registrar id serving the lease, or an errno and `err`. */
	int (*acquire)(uint64_t lease, uint64_t addr, uint64_t len, unsigned access, uint64_t *reg, char *err, size_t errn);
	int (*release)(uint64_t lease, char *err, size_t errn);
	int (*flush)(char *err, size_t errn); /* NULL: unsupported */
	void (*forked)(void);                 /* in the child; may be NULL */
	/* `destroy`: destroys the cache (the leases it held become orphans:
	 * lease_orphan_all()); returns 0, or an errno (EBUSY: refused, nothing
	 * changed) and `err`. `create`: creates it anew as init did. NULL:
	 * unsupported. */
	int (*destroy)(char *err, size_t errn);
	int (*create)(char *err, size_t errn);
};

/* Pins the range (io_uring registrar; nothing with `--registrar
 * counting`), reports the call (and pauses here if the running acquire
 * asked to); returns the new registration's id, or 0 if the pin failed (the
 * reason goes into the acquire's error reply): the peer's registration
 * callback must then fail. */
uint64_t adapter_reg(uint64_t addr, uint64_t len, unsigned access);
void adapter_dereg(uint64_t id);
/* For peers whose release hook the adapter can follow with its own: pause
 * here if the running memory operation asked to. */
void adapter_hook_pause(void);
/* A free-form log line (shown in transcripts). */
void adapter_log(const char *fmt, ...);
const char *access_name(unsigned access, char *buf, size_t n);

/* Takes `--registrar io_uring|counting` (default io_uring) out of argv;
 * returns -1 (message on stderr) on a bad value. Call before adapter_main. */
int adapter_parse_args(int *argc, char **argv);
int adapter_main(const struct peer *p);

#endif
