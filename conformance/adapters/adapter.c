/* Protocol plumbing for the C conformance adapters; see adapter.h and
 * docs/conformance-protocol.md. Written for this project.
 *
 * The registrar: by default every adapter_reg() pins the range as an
 * io_uring fixed buffer (../uring_reg.h, FOLL_LONGTERM like ibv_reg_mr) and
 * adapter_dereg() unpins it; the data commands (dma_in, dma_out, app_write,
 * app_read) move bytes through those pins. `--registrar counting` only
 * reports the calls (the data commands are then `unsupported`). */
#define _GNU_SOURCE
#define UR_SLOTS 4096
#include "adapter.h"
#include "../uring_reg.h"
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE 4096ul
#define ARENA (4ul << 20)
/* The largest arena a case may ask for here (`config.arena_len`). */
#define ARENA_MAX (64ul << 20)
#define ARENA_HINT 0x200000000000ul
#define MAX_THREADS 8

static const struct peer *peer;
/* The protocol's stream: the original stdout. File descriptor 1 itself goes
 * to stderr, so that a peer library that logs to stdout (UCX's warnings)
 * does not write into the protocol. */
static FILE *proto;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t next_reg_id;
static pthread_mutex_t id_lock = PTHREAD_MUTEX_INITIALIZER;

static __thread int cur_thread;
static __thread int cur_pause;

static pthread_mutex_t pause_lock = PTHREAD_MUTEX_INITIALIZER;
/* Commands paused now: `fork` does not wait for them (their threads do not
 * exist in the child). */
static int paused_now;
static pthread_cond_t pause_cv = PTHREAD_COND_INITIALIZER;
static int continued[MAX_THREADS];

static void emit(const char *s)
{
	pthread_mutex_lock(&out_lock);
	fputs(s, proto);
	fputc('\n', proto);
	fflush(proto);
	pthread_mutex_unlock(&out_lock);
}

void adapter_log(const char *fmt, ...)
{
	char msg[512], line[700];
	size_t i, j = 0;
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	for (i = 0; msg[i] && j < sizeof(msg) - 2; i++) {
		char c = msg[i];
		if (c == '"' || c == '\\' || (unsigned char)c < 0x20)
			c = ' ';
		msg[j++] = c;
	}
	msg[j] = 0;
	snprintf(line, sizeof(line), "{\"ev\":\"log\",\"text\":\"%s\"}", msg);
	emit(line);
}

const char *access_name(unsigned a, char *buf, size_t n)
{
	static const char *names[] = { "local_write", "remote_read", "remote_write", "remote_atomic" };
	size_t used = 0;
	int i;

	buf[0] = 0;
	if (!a) {
		snprintf(buf, n, "local_read");
		return buf;
	}
	for (i = 0; i < 4; i++)
		if (a & (1u << i))
			used += snprintf(buf + used, n - used, "%s%s", used ? "+": "", names[i]);
	return buf;
}

static unsigned parse_access(const char *s)
{
	unsigned a = 0;
	char tmp[128], *tok, *save;

	snprintf(tmp, sizeof(tmp), "%s", s);
	for (tok = strtok_r(tmp, "+", &save); tok; tok = strtok_r(NULL, "+", &save)) {
		if (!strcmp(tok, "local_write")) a |= ACC_LOCAL_WRITE;
		else if (!strcmp(tok, "remote_read")) a |= ACC_REMOTE_READ;
		else if (!strcmp(tok, "remote_write")) a |= ACC_REMOTE_WRITE;
		else if (!strcmp(tok, "remote_atomic")) a |= ACC_REMOTE_ATOMIC;
		else if (!strcmp(tok, "rw")) a |= ACC_LOCAL_WRITE | ACC_REMOTE_READ | ACC_REMOTE_WRITE;
	}
	return a;
}

/* The raw value of "key" in a flat JSON line (strings without quotes). */
static int json_get(const char *line, const char *key, char *out, size_t n)
{
	char pat[64];
	const char *p;
	size_t i = 0;

	snprintf(pat, sizeof(pat), "\"%s\"", key);
	p = strstr(line, pat);
	if (!p)
		return -1;
	p += strlen(pat);
	while (*p == ' ' || *p == ':')
		p++;
	if (*p == '"') {
		p++;
		while (*p && *p != '"' && i + 1 < n)
			out[i++] = *p++;
	} else {
		while (*p && *p != ',' && *p != '}' && *p != ' ' && i + 1 < n)
			out[i++] = *p++;
	}
	out[i] = 0;
	return 0;
}

static uint64_t json_u64(const char *line, const char *key, uint64_t dflt)
{
	char v[64];

	if (json_get(line, key, v, sizeof(v)) || !strcmp(v, "null"))
		return dflt;
	return strtoull(v, NULL, strncmp(v, "0x", 2) ? 10: 16);
}

static void pause_here(void)
{
	char line[80];

	if (!cur_pause)
		return;
	cur_pause = 0;
	snprintf(line, sizeof(line), "{\"ev\":\"paused\",\"thread\":%d}", cur_thread);
	/* Counted once the line is out (out_lock released): a fork waits
	 * for the count, and a child must not inherit out_lock held. */
	emit(line);
	pthread_mutex_lock(&pause_lock);
	paused_now++;
	while (!continued[cur_thread])
		pthread_cond_wait(&pause_cv, &pause_lock);
	continued[cur_thread] = 0;
	paused_now--;
	pthread_mutex_unlock(&pause_lock);
}

static __thread int in_acquire;
static void run_during(const char *list);
static __thread const char *during_src;
static __thread char during_err[320];

/* ------------------------------------------------------------------ */
/* The registrar (io_uring pins, or counting) and the data commands. */

static int use_uring = 1;
#define MAX_IDS 65536
static struct { int slot; uint64_t addr, len; } reg_tab[MAX_IDS]; /* by id; slot -1: none */
#define MAX_DATA_LEASES 1024
static struct { uint64_t lease, id; int used; } lease_reg[MAX_DATA_LEASES];
static pthread_mutex_t data_lock = PTHREAD_MUTEX_INITIALIZER;
/* Why the last adapter_reg() of this thread failed (it returned 0). */
static __thread char reg_error[256];

int adapter_parse_args(int *argc, char **argv)
{
	int i, j = 1;

	for (i = 1; i < *argc; i++) {
		const char *v = NULL;
		if (!strcmp(argv[i], "--registrar") && i + 1 < *argc)
			v = argv[++i];
		else if (!strncmp(argv[i], "--registrar=", 12))
			v = argv[i] + 12;
		else if (!strcmp(argv[i], "--registrar")) {
			fprintf(stderr, "%s: --registrar needs a value: io_uring or counting\n", argv[0]);
			return -1;
		}
		if (!v) {
			argv[j++] = argv[i];
			continue;
		}
		if (!strcmp(v, "io_uring") || !strcmp(v, "uring"))
			use_uring = 1;
		else if (!strcmp(v, "counting"))
			use_uring = 0;
		else {
			fprintf(stderr, "%s: --registrar %s: expected io_uring or counting\n", argv[0], v);
			return -1;
		}
	}
	*argc = j;
	argv[j] = NULL;
	return 0;
}

static void lease_reg_put(uint64_t lease, uint64_t id)
{
	int i;

	pthread_mutex_lock(&data_lock);
	for (i = 0; i < MAX_DATA_LEASES; i++)
		if (!lease_reg[i].used) {
			lease_reg[i].lease = lease;
			lease_reg[i].id = id;
			lease_reg[i].used = 1;
			break;
		}
	pthread_mutex_unlock(&data_lock);
}

static uint64_t lease_reg_get(uint64_t lease, int drop)
{
	uint64_t id = 0;
	int i;

	pthread_mutex_lock(&data_lock);
	for (i = 0; i < MAX_DATA_LEASES; i++)
		if (lease_reg[i].used && lease_reg[i].lease == lease) {
			id = lease_reg[i].id;
			if (drop)
				lease_reg[i].used = 0;
			break;
		}
	pthread_mutex_unlock(&data_lock);
	return id;
}

/* Appends the bytes of p[0..n) to a run-length list `[[byte,count],...]`
 * being built in out (at most 32 runs; *trunc set beyond). */
struct runs { int byte[32]; uint64_t count[32]; int n, trunc; };

static void runs_add(struct runs *r, const unsigned char *p, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		if (r->n && r->byte[r->n - 1] == p[i]) {
			r->count[r->n - 1]++;
		} else if (r->n < 32) {
			r->byte[r->n] = p[i];
			r->count[r->n++] = 1;
		} else {
			r->trunc = 1;
			return;
		}
	}
}

static void reply_runs(uint64_t seq, const struct runs *r)
{
	char line[1400];
	size_t u;
	int i;

	u = (size_t)snprintf(line, sizeof(line), "{\"seq\":%lu,\"ok\":true,\"runs\":[", (unsigned long)seq);
	for (i = 0; i < r->n; i++)
		u += (size_t)snprintf(line + u, sizeof(line) - u, "%s[%d,%lu]", i ? ",": "", r->byte[i], (unsigned long)r->count[i]);
	snprintf(line + u, sizeof(line) - u, "]%s}", r->trunc ? ",\"truncated\":true": "");
	emit(line);
}

static void reply_err(uint64_t seq, int err, const char *what);
static void reply_ok(uint64_t seq, const char *extra);

/* dma_in / dma_out / app_write / app_read (docs/conformance-protocol.md,
 * "Data commands"). */
static void do_data(uint64_t seq, const char *cmd, const char *line)
{
	uint64_t addr = json_u64(line, "addr", 0), len = json_u64(line, "len", 0), lease, id;
	unsigned char byte = (unsigned char)json_u64(line, "byte", 0), buf[4096];
	struct runs runs;
	char err[300];
	uint64_t done;
	int slot, r;

	memset(&runs, 0, sizeof(runs));
	if (!strcmp(cmd, "app_write")) {
		memset((void *)addr, byte, len);
		reply_ok(seq, NULL);
		return;
	}
	if (!strcmp(cmd, "app_read")) {
		runs_add(&runs, (const unsigned char *)addr, len);
		reply_runs(seq, &runs);
		return;
	}
	if (!use_uring) {
		reply_err(seq, -2, "the counting registrar pins nothing: no device can move data (run with --registrar io_uring)");
		return;
	}
	lease = json_u64(line, "lease", 0);
	id = lease_reg_get(lease, 0);
	if (!id || id >= MAX_IDS || reg_tab[id].slot < 0) {
		snprintf(err, sizeof(err), "%s: lease %lu holds no registration of the io_uring registrar", cmd, (unsigned long)lease);
		reply_err(seq, EINVAL, err);
		return;
	}
	slot = reg_tab[id].slot;
	if (addr < reg_tab[id].addr || addr + len > reg_tab[id].addr + reg_tab[id].len) {
		snprintf(err, sizeof(err), "%s: [0x%lx, 0x%lx) lies outside registration %lu [0x%lx, 0x%lx)", cmd, (unsigned long)addr,
			 (unsigned long)(addr + len), (unsigned long)id, (unsigned long)reg_tab[id].addr,
			 (unsigned long)(reg_tab[id].addr + reg_tab[id].len));
		reply_err(seq, EFAULT, err);
		return;
	}
	for (done = 0; done < len; done += sizeof(buf)) {
		size_t n = len - done < sizeof(buf) ? len - done: sizeof(buf);
		if (!strcmp(cmd, "dma_in")) {
			r = ur_dma_write(slot, (void *)(addr + done), n, byte);
		} else {
			r = ur_dma_read(slot, (void *)(addr + done), n, buf);
			if (!r)
				runs_add(&runs, buf, n);
		}
		if (r) {
			snprintf(err, sizeof(err), "%s through registration %lu (io_uring slot %d) at 0x%lx: %s", cmd, (unsigned long)id, slot,
				 (unsigned long)(addr + done), strerror(-r));
			reply_err(seq, -r, err);
			return;
		}
	}
	if (!strcmp(cmd, "dma_in"))
		reply_ok(seq, NULL);
	else
		reply_runs(seq, &runs);
}

uint64_t adapter_reg(uint64_t addr, uint64_t len, unsigned access)
{
	char line[256], acc[96];
	uint64_t id;
	int slot = -1;

	reg_error[0] = 0;
	if (use_uring) {
		slot = ur_reg((void *)addr, len);
		if (slot < 0) {
			snprintf(reg_error, sizeof(reg_error), "the io_uring registrar could not pin [0x%lx, 0x%lx): %s",
				 (unsigned long)addr, (unsigned long)(addr + len), strerror(-slot));
			adapter_log("%s", reg_error);
			return 0;
		}
	}
	pthread_mutex_lock(&id_lock);
	id = ++next_reg_id;
	pthread_mutex_unlock(&id_lock);
	if (id < MAX_IDS) {
		reg_tab[id].slot = slot;
		reg_tab[id].addr = addr;
		reg_tab[id].len = len;
	} else if (slot >= 0) {
		adapter_log("registration %lu: beyond the data table, no data commands on it", (unsigned long)id);
	}
	snprintf(line, sizeof(line), "{\"ev\":\"reg\",\"id\":%lu,\"addr\":\"0x%lx\",\"len\":%lu,\"access\":\"%s\"}",
		 (unsigned long)id, (unsigned long)addr, (unsigned long)len, access_name(access, acc, sizeof(acc)));
	emit(line);
	if (in_acquire && during_src) {
		const char *d = during_src;
		during_src = NULL; /* once per acquire: a retry performs nothing */
		run_during(d);
	}
	if (in_acquire)
		pause_here();
	return id;
}

void adapter_dereg(uint64_t id)
{
	char line[80];

	if (use_uring && id && id < MAX_IDS && reg_tab[id].slot >= 0) {
		int e = ur_dereg(reg_tab[id].slot);
		if (e)
			adapter_log("the io_uring registrar could not unpin registration %lu (slot %d): %s", (unsigned long)id,
				    reg_tab[id].slot, strerror(-e));
		reg_tab[id].slot = -1;
	}
	snprintf(line, sizeof(line), "{\"ev\":\"dereg\",\"id\":%lu}", (unsigned long)id);
	emit(line);
}

static __thread int in_mem_op;

void adapter_hook_pause(void)
{
	if (in_mem_op)
		pause_here();
}

/* ------------------------------------------------------------------ */

static void reply_ok(uint64_t seq, const char *extra)
{
	char line[256];

	snprintf(line, sizeof(line), "{\"seq\":%lu,\"ok\":true%s%s}", (unsigned long)seq, extra ? ",": "", extra ? extra: "");
	emit(line);
}

static void reply_err(uint64_t seq, int err, const char *what)
{
	char line[700], clean[512];
	size_t i;

	snprintf(clean, sizeof(clean), "%s", what);
	for (i = 0; clean[i]; i++)
		if (clean[i] == '"' || clean[i] == '\\' || (unsigned char)clean[i] < 0x20)
			clean[i] = ' ';
	snprintf(line, sizeof(line), "{\"seq\":%lu,\"ok\":false,\"errno\":%d,\"error\":\"%s\"%s}", (unsigned long)seq, err, clean,
		 err == -2 ? ",\"unsupported\":true": "");
	emit(line);
}

static void touch(uint64_t a, uint64_t len)
{
	memset((void *)a, 0x5a, len);
}

static int map_fresh(uint64_t a, uint64_t len, int flags, char *err, size_t n)
{
	void *p = mmap((void *)a, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);

	if (p == MAP_FAILED) {
		int e = errno;
		snprintf(err, n, "mmap: %s", strerror(e));
		return e;
	}
	if ((uint64_t)p != a) {
		munmap(p, len);
		snprintf(err, n, "mmap placed the pages at %p", p);
		return EEXIST;
	}
	touch(a, len);
	return 0;
}

/* Performs one memory command; returns 0, an errno (with `err`), or -2 for
 * an unknown command. `malloc` and `brk_grow` put the address in `out`. */
static int mem_exec(const char *cmd, const char *line, char *err, size_t errn, uint64_t *out)
{
	uint64_t addr = json_u64(line, "addr", 0), len = json_u64(line, "len", 0), count = json_u64(line, "count", 1), i;
	int r = 0, e = 0;

	if (!strcmp(cmd, "malloc")) {
		void *p = malloc(len);
		if (!p) {
			snprintf(err, errn, "malloc failed");
			return errno ? errno : ENOMEM;
		}
		touch((uint64_t)p, len);
		*out = (uint64_t)p;
		return 0;
	}
	if (!strcmp(cmd, "brk_grow")) {
		uint64_t cur = (uint64_t)sbrk(0), top = (cur + PAGE - 1) & ~(PAGE - 1);
		if (sbrk(top - cur + len) == (void *)-1) {
			snprintf(err, errn, "sbrk failed");
			return errno;
		}
		touch(top, len);
		*out = top;
		return 0;
	}
	if (!strcmp(cmd, "mmap"))
		return map_fresh(addr, len, MAP_FIXED_NOREPLACE, err, errn);
	if (!strcmp(cmd, "scratch")) {
		/* The allocator's own traffic: its frees may unmap or madvise,
		 * and the peer's hooks see them. */
		uint64_t rounds = json_u64(line, "rounds", 1), k;
		void **blocks = calloc(count, sizeof(void *));
		if (!blocks) {
			snprintf(err, errn, "calloc failed");
			return ENOMEM;
		}
		for (k = 0; k < rounds; k++) {
			uint64_t got = 0;
			for (i = 0; i < count; i++) {
				if (!(blocks[i] = malloc(len)))
					break;
				touch((uint64_t)blocks[i], len);
				got++;
			}
			in_mem_op = 1;
			for (i = 0; i < got; i++)
				free(blocks[i]);
			in_mem_op = 0;
			if (got < count) {
				free(blocks);
				snprintf(err, errn, "scratch: malloc failed");
				return ENOMEM;
			}
		}
		free(blocks);
		return 0;
	}
	if (!strcmp(cmd, "unmap_map_cycles")) {
		for (i = 0; i < count; i++) {
			in_mem_op = 1;
			r = munmap((void *)addr, len);
			in_mem_op = 0;
			if (r) {
				e = errno;
				snprintf(err, errn, "munmap (cycle %lu): %s", (unsigned long)i, strerror(e));
				return e;
			}
			if ((e = map_fresh(addr, len, MAP_FIXED_NOREPLACE, err, errn)))
				return e;
		}
		return 0;
	}
	/* A release: the peer's hooks run inside the call. */
	in_mem_op = 1;
	if (!peer->pause_in_hook)
		pause_here();
	if (!strcmp(cmd, "munmap")) {
		r = munmap((void *)addr, len);
	} else if (!strcmp(cmd, "mmap_fixed")) {
		e = map_fresh(addr, len, MAP_FIXED, err, errn);
	} else if (!strcmp(cmd, "madvise_dontneed")) {
		r = madvise((void *)addr, len, MADV_DONTNEED);
	} else if (!strcmp(cmd, "madvise_free")) {
		r = madvise((void *)addr, len, MADV_FREE);
	} else if (!strcmp(cmd, "mremap_move")) {
		void *t = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), *q;
		errno = 0;
		q = t == MAP_FAILED ? MAP_FAILED: mremap((void *)addr, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, t);
		if (q == MAP_FAILED) {
			r = -1;
		} else if (q != t) {
			/* A hook that drops mremap's fifth argument moves the
			 * pages somewhere else (UCX 1.13's UCM). */
			e = EFAULT;
			snprintf(err, errn, "mremap(MREMAP_FIXED) put the pages at %p, not at the target %p", q, t);
		}
	} else if (!strcmp(cmd, "mremap_shrink")) {
		r = mremap((void *)addr, len, json_u64(line, "new_len", 0), 0) == MAP_FAILED ? -1: 0;
	} else if (!strcmp(cmd, "free")) {
		free((void *)addr);
	} else if (!strcmp(cmd, "brk_shrink")) {
		r = sbrk(-(intptr_t)len) == (void *)-1 ? -1: 0;
	} else {
		in_mem_op = 0;
		snprintf(err, errn, "unknown command %s", cmd);
		return -2;
	}
	if (r) {
		e = errno;
		snprintf(err, errn, "%s: %s", cmd, strerror(e));
	}
	in_mem_op = 0;
	return e;
}

static void do_mem(uint64_t seq, const char *cmd, const char *line)
{
	char err[300] = "", extra[96];
	uint64_t out = 0;
	int e = mem_exec(cmd, line, err, sizeof(err), &out);

	if (e) {
		reply_err(seq, e, err);
	} else if (!strcmp(cmd, "malloc") || !strcmp(cmd, "brk_grow")) {
		snprintf(extra, sizeof(extra), "\"addr\":\"0x%lx\"", (unsigned long)out);
		reply_ok(seq, extra);
	} else {
		reply_ok(seq, NULL);
	}
}

/* An acquire's `during_register`: the registrar performs each memory
 * operation of the list (flat JSON objects) once the pages are pinned, on
 * the acquiring thread. */

static void run_during(const char *list)
{
	const char *p = list;
	char obj[512], mem[32], err[300];
	uint64_t out;
	size_t n;
	int e;

	while ((p = strchr(p, '{'))) {
		const char *q = strchr(p, '}');
		if (!q)
			break;
		n = (size_t)(q - p + 1) < sizeof(obj) ? (size_t)(q - p + 1) : sizeof(obj) - 1;
		memcpy(obj, p, n);
		obj[n] = 0;
		p = q + 1;
		if (json_get(obj, "mem", mem, sizeof(mem)))
			continue;
		err[0] = 0;
		if ((e = mem_exec(mem, obj, err, sizeof(err), &out))) {
			snprintf(during_err, sizeof(during_err), "during_register: %s", err);
			return;
		}
	}
}

static void execute(const char *full)
{
	char cmd[32] = "", acc[128] = "local_read", err[300] = "", extra[64];
	char *line = strdup(full), *d = strstr(line, "\"during_register\""), *e;
	uint64_t seq, reg = 0;
	int r;

	/* The top-level fields: the `during_register` list (whose objects
	 * have fields of the same names) blanked out. */
	if (d && (e = strchr(d, ']')))
		memset(d, ' ', (size_t)(e - d + 1));
	seq = json_u64(line, "seq", 0);

	json_get(line, "cmd", cmd, sizeof(cmd));
	cur_pause = 0;
	if (json_get(line, "pause", extra, sizeof(extra)) == 0 && !strcmp(extra, "true"))
		cur_pause = 1;
	if (!strcmp(cmd, "acquire")) {
		json_get(line, "access", acc, sizeof(acc));
		during_src = strstr(full, "\"during_register\"");
		during_err[0] = 0;
		in_acquire = 1;
		r = peer->acquire(json_u64(line, "lease", 0), json_u64(line, "addr", 0), json_u64(line, "len", 0), parse_access(acc), &reg,
				  err, sizeof(err));
		in_acquire = 0;
		during_src = NULL;
		if (during_err[0]) {
			char l[700];
			size_t i;
			for (i = 0; during_err[i]; i++)
				if (during_err[i] == '"' || during_err[i] == '\\')
					during_err[i] = ' ';
			snprintf(l, sizeof(l), "{\"seq\":%lu,\"ok\":false,\"errno\":0,\"error\":\"%s\",\"during_register_failed\":true}",
				 (unsigned long)seq, during_err);
			emit(l);
		} else if (r) {
			if (reg_error[0])
				snprintf(err + strlen(err), sizeof(err) - strlen(err), " (%s)", reg_error);
			reply_err(seq, r, err);
		} else {
			lease_reg_put(json_u64(line, "lease", 0), reg);
			snprintf(extra, sizeof(extra), "\"reg\":%lu", (unsigned long)reg);
			reply_ok(seq, extra);
		}
	} else if (!strcmp(cmd, "release")) {
		lease_reg_get(json_u64(line, "lease", 0), 1);
		r = peer->release(json_u64(line, "lease", 0), err, sizeof(err));
		if (r)
			reply_err(seq, r, err);
		else
			reply_ok(seq, NULL);
	} else if (!strcmp(cmd, "flush")) {
		if (!peer->flush) {
			reply_err(seq, -2, "flush is not supported");
			free(line);
			return;
		}
		r = peer->flush(err, sizeof(err));
		if (r)
			reply_err(seq, r, err);
		else
			reply_ok(seq, NULL);
	} else if (!strcmp(cmd, "destroy") || !strcmp(cmd, "create")) {
		int (*f)(char *, size_t) = !strcmp(cmd, "destroy") ? peer->destroy : peer->create;
		if (!f) {
			reply_err(seq, -2, "destroy and create are not supported by this adapter");
		} else if ((r = f(err, sizeof(err)))) {
			reply_err(seq, r, err);
		} else {
			reply_ok(seq, NULL);
		}
	} else if (!strcmp(cmd, "dma_in") || !strcmp(cmd, "dma_out") || !strcmp(cmd, "app_write") || !strcmp(cmd, "app_read")) {
		do_data(seq, cmd, line);
	} else if (!strcmp(cmd, "trim") || !strcmp(cmd, "stats")) {
		reply_err(seq, -2, "not supported by this peer");
	} else {
		do_mem(seq, cmd, line);
	}
	cur_pause = 0;
	free(line);
}

/* Workers: one per case thread, each runs one command at a time. */
struct worker {
	pthread_t tid;
	pthread_mutex_t lock;
	pthread_cond_t cv;
	char *cmd;
	int exists, index;
};
static struct worker workers[MAX_THREADS];
static int inflight;
static pthread_mutex_t inflight_lock = PTHREAD_MUTEX_INITIALIZER;

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	char *cmd;

	cur_thread = w->index;
	for (;;) {
		pthread_mutex_lock(&w->lock);
		while (!w->cmd)
			pthread_cond_wait(&w->cv, &w->lock);
		cmd = w->cmd;
		w->cmd = NULL;
		pthread_mutex_unlock(&w->lock);
		execute(cmd);
		free(cmd);
		/* After the reply: `fork` and `end` wait for this (wait_idle),
		 * so no worker holds out_lock when the process forks. */
		pthread_mutex_lock(&inflight_lock);
		inflight--;
		pthread_mutex_unlock(&inflight_lock);
	}
	return NULL;
}

static void dispatch(int t, const char *line)
{
	struct worker *w = &workers[t];

	if (!w->exists) {
		pthread_mutex_init(&w->lock, NULL);
		pthread_cond_init(&w->cv, NULL);
		w->cmd = NULL;
		w->index = t;
		w->exists = 1;
		pthread_create(&w->tid, NULL, worker_main, w);
	}
	pthread_mutex_lock(&inflight_lock);
	inflight++;
	pthread_mutex_unlock(&inflight_lock);
	pthread_mutex_lock(&w->lock);
	w->cmd = strdup(line);
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->lock);
}

/* Until every command has replied or is paused. */
static void wait_idle(void)
{
	int i, n, p;

	for (i = 0; i < 100000; i++) {
		pthread_mutex_lock(&pause_lock);
		p = paused_now;
		pthread_mutex_unlock(&pause_lock);
		pthread_mutex_lock(&inflight_lock);
		n = inflight;
		pthread_mutex_unlock(&inflight_lock);
		if (n <= p)
			return;
		usleep(100);
	}
}

int adapter_main(const struct peer *p)
{
	char *line = NULL, cmd[32], limits[256] = "{}", err[300] = "", out[1400];
	size_t cap = 0;
	void *arena;
	uint64_t seq, arena_len;
	int t;

	peer = p;
	/* Keep our own allocations off the brk heap (brk_grow/brk_shrink move
	 * the break), as fabtests' mr_cache_evict does. */
	mallopt(M_MMAP_THRESHOLD, 1);
	proto = fdopen(dup(1), "w");
	if (!proto || dup2(2, 1) < 0)
		return 2;
	setvbuf(proto, NULL, _IOFBF, 1 << 16);
	if (getline(&line, &cap, stdin) <= 0)
		return 0;
	seq = json_u64(line, "seq", 0);
	/* The arena the case asks for, at least ours; more than
	 * ARENA_MAX: the case is unsupported here. */
	arena_len = json_u64(line, "arena_len", 0);
	if (arena_len > ARENA_MAX) {
		reply_err(seq, -2, "the case asks for a larger arena than this adapter maps (64 MiB)");
		return 0;
	}
	if (arena_len < ARENA)
		arena_len = ARENA;
	arena_len = (arena_len + PAGE - 1) & ~(PAGE - 1);
	for (t = 0; t < MAX_IDS; t++)
		reg_tab[t].slot = -1;
	if (use_uring && ur_try_init(err, sizeof(err))) {
		char msg[400];
		snprintf(msg, sizeof(msg), "the io_uring registrar is unavailable: %s (run with --registrar counting to judge by event order only)", err);
		reply_err(seq, 0, msg);
		return 2;
	}
	if (p->init(json_u64(line, "max_regions", 0), json_u64(line, "max_pinned_bytes", 0), limits, sizeof(limits), err, sizeof(err))) {
		reply_err(seq, 0, err);
		return 2;
	}
	/* Far below where the kernel puts new mappings (top down from
	 * mmap_base): the holes the cases make are not filled by other
	 * allocations (ours are all mmap-served). */
	arena = mmap((void *)ARENA_HINT, arena_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (arena == MAP_FAILED)
		arena = mmap(NULL, arena_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (arena == MAP_FAILED) {
		reply_err(seq, errno, "cannot map the arena");
		return 2;
	}
	touch((uint64_t)arena, arena_len);
	snprintf(out, sizeof(out),
		 "{\"seq\":%lu,\"ok\":true,\"protocol\":1,\"name\":\"%s\",\"version\":\"%s\",\"policy\":%s%s%s,"
		 "\"page_size\":4096,\"caps\":%s,\"access_classes\":%s,\"eviction\":\"lru\",\"limits\":%s,"
		 "\"arena\":{\"addr\":\"0x%lx\",\"len\":%lu},\"chunk_size\":%lu,\"registrar\":\"%s\"}",
		 (unsigned long)seq, p->name, p->version, p->policy ? "\"": "", p->policy ? p->policy: "null", p->policy ? "\"": "",
		 p->caps, p->access_classes ? p->access_classes: "null", limits, (unsigned long)arena, (unsigned long)arena_len,
		 p->chunk_size ? p->chunk_size: PAGE, use_uring ? "io_uring": "counting");
	emit(out);
	while (getline(&line, &cap, stdin) > 0) {
		if (json_get(line, "cmd", cmd, sizeof(cmd)))
			continue;
		seq = json_u64(line, "seq", 0);
		t = (int)json_u64(line, "thread", 0);
		if (t < 0 || t >= MAX_THREADS) {
			reply_err(seq, EINVAL, "thread out of range");
			continue;
		}
		if (!strcmp(cmd, "continue")) {
			pthread_mutex_lock(&pause_lock);
			continued[t] = 1;
			pthread_cond_broadcast(&pause_cv);
			pthread_mutex_unlock(&pause_lock);
			reply_ok(seq, NULL);
		} else if (!strcmp(cmd, "query")) {
			/* No count of what the peer's registrar holds: deferred
			 * deregistration is reported, not judged (no `query` cap). */
			reply_err(seq, -2, "query is not implemented by this adapter");
		} else if (!strcmp(cmd, "rss")) {
			/* The resident set, for the L2 bound (rss_mark/rss_check). */
			FILE *f = fopen("/proc/self/statm", "r");
			unsigned long size = 0, res = 0;
			char extra[64];
			if (f && fscanf(f, "%lu %lu", &size, &res) == 2) {
				snprintf(extra, sizeof(extra), "\"rss\":%lu", res * (unsigned long)sysconf(_SC_PAGESIZE));
				reply_ok(seq, extra);
			} else {
				reply_err(seq, errno, "cannot read /proc/self/statm");
			}
			if (f)
				fclose(f);
		} else if (!strcmp(cmd, "end")) {
			wait_idle();
			reply_ok(seq, NULL);
			fflush(proto);
			_exit(0);
		} else if (!strcmp(cmd, "fork")) {
			pid_t pid;
			wait_idle();
			/* Not under out_lock: a peer's atfork handler may
			 * deregister (UCX's PURGE_ON_FORK), which reports. */
			fflush(proto);
			pid = fork();
			if (pid < 0) {
				reply_err(seq, errno, "fork failed");
			} else if (pid == 0) {
				char extra[48];
				/* Only this thread exists here: a command
				 * paused in the parent never ends in the child. */
				memset(workers, 0, sizeof(workers));
				inflight = 0;
				paused_now = 0;
				memset(continued, 0, sizeof(continued));
				if (p->forked)
					p->forked();
				snprintf(extra, sizeof(extra), "\"pid\":%d", (int)getpid());
				reply_ok(seq, extra);
			} else {
				int st = 0;
				waitpid(pid, &st, 0);
				_exit(WIFEXITED(st) ? WEXITSTATUS(st): 128 + WTERMSIG(st));
			}
		} else {
			dispatch(t, line);
		}
	}
	wait_idle();
	return 0;
}
