/*
 * libmrcache_pmpi: the recorder behind `mrcache record` (traces/README.md).
 *
 * Loaded with LD_PRELOAD into every rank of an Open MPI job, it writes one
 * trace per rank in mrcache's format (spec.md#T): a header line, then one
 * JSON object per event.
 *
 *   - MPI calls (PMPI interposition): every user buffer an RDMA transport
 *     could register becomes `acquire` records, one lease per contiguous
 *     block (derived datatypes are flattened), and `release` records when the
 *     buffer is no longer in use: right after a blocking call; at the
 *     Wait/Test that completes a nonblocking or persistent request; at the
 *     window synchronisation that completes an RMA operation; at
 *     MPI_Free_mem / MPI_Win_free for MPI_Alloc_mem and window memory.
 *   - Memory events: the malloc family (`alloc` / `free`), and the ways memory
 *     goes back to the kernel as `release_event` records: munmap, mremap
 *     (source), madvise(DONTNEED/FREE/REMOVE), mmap(MAP_FIXED), brk/sbrk
 *     shrinks, shmdt. Unmaps that glibc does internally are derived: a free()
 *     of an mmap-served chunk (IS_MMAPPED bit of the chunk header) is a munmap
 *     of the chunk's mapping, a realloc() that mremaps such a chunk is an
 *     mremap_source, and a drop of __curbrk across a free/realloc is a
 *     brk_shrink.
 *
 * Re-entrancy rules (measured pitfalls, see the issue): a thread-local guard
 * stops recording of the recorder's own work; nothing here calls stdio or
 * malloc while logging (one static buffer, write(2)); the malloc family calls
 * glibc's __libc_* entry points directly; the mmap family falls back to raw
 * syscalls until dlsym(RTLD_NEXT) has resolved the real functions.
 *
 * Layout: one translation unit (the recorder's state is static). This file
 * holds the state, the output buffer, leases and the start and end of
 * recording; it includes the parts in pmpi/: memory.c (memory hooks),
 * datatypes.c (flattening), requests.c (requests and their completion),
 * rma.c (windows, MPI_Alloc_mem, RMA), p2p.c (point to point) and
 * collectives.c.
 *
 * Environment (set by `mrcache record`):
 *   MRCACHE_TRACE_DIR       where rank-<r>.jsonl goes; without it the library is inert
 *   MRCACHE_THRESHOLD       alloc/free/mmap records below this many bytes are dropped (default 4096)
 *   MRCACHE_INCLUDE_INIT=1  also record during MPI_Init (needs OMPI_COMM_WORLD_RANK/SIZE)
 *   MRCACHE_PROGRAM, MRCACHE_PROGRAM_VERSION, MRCACHE_COMMAND, MRCACHE_DESCRIPTION: header fields
 */
#define _GNU_SOURCE
#include <mpi.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MRC_RECORDER_VERSION "0.1.0"
#define MRC_EXPORT __attribute__((visibility("default")))

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);
extern void *__curbrk;

/* ------------------------------------------------------------------------ */
/* State                                                                      */

static atomic_int g_recording;        /* events are being written */
static int g_fd = -1;                 /* the rank's trace file */
static int g_rank, g_size;
static uint64_t g_t0;                 /* CLOCK_MONOTONIC ns at MPI_Init entry */
static size_t g_threshold = 4096;
static int g_include_init;
static char g_dir[1024];
static uint64_t g_next_lease = 1;     /* under g_lock */
static atomic_int g_next_tid = 1;

/* Counters written to rank-<r>.stats.json at the end. */
static uint64_t g_records, g_capped_types, g_req_overflow, g_win_overflow, g_write_errors, g_bytes_dropped;

static __thread int t_guard;          /* inside the recorder: record nothing */
static __thread int t_depth;          /* inside an MPI call */
static __thread int t_tid = -1;       /* small thread number, 0 = main */

static atomic_flag g_lock = ATOMIC_FLAG_INIT;
static uint64_t g_self_ns;            /* time spent holding (and waiting for) the lock: the recorder's own cost */
static __thread uint64_t t_lock_t0;

static uint64_t now_ns(void);
static void lock(void) {
    unsigned spins = 0;
    t_lock_t0 = now_ns();
    while (atomic_flag_test_and_set_explicit(&g_lock, memory_order_acquire)) {
        if (++spins > 64) sched_yield();
    }
}
static int try_lock_bounded(unsigned attempts) {
    for (unsigned i = 0; i < attempts; i++) {
        if (!atomic_flag_test_and_set_explicit(&g_lock, memory_order_acquire)) return 1;
        sched_yield();
    }
    return 0;
}
static void unlock(void) {
    g_self_ns += now_ns() - t_lock_t0;
    atomic_flag_clear_explicit(&g_lock, memory_order_release);
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------------------ */
/* Output: one static buffer, whole records only, write(2)                    */

#define BUF_SIZE (1u << 20)
#define BUF_SLACK 1024u /* a record is < 300 bytes */
static char g_buf[BUF_SIZE];
static size_t g_used;      /* bytes in g_buf */
static size_t g_committed; /* bytes of complete records */

static void write_all(int fd, const char *p, size_t n) {
    for (int tries = 0; n > 0 && tries < 10000; tries++) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) { g_write_errors++; return; }
        p += w;
        n -= (size_t)w;
    }
}

static void flush_locked(void) {
    if (g_fd >= 0 && g_committed) write_all(g_fd, g_buf, g_committed);
    else g_bytes_dropped += g_committed; /* no file (cannot happen while recording) */
    memmove(g_buf, g_buf + g_committed, g_used - g_committed);
    g_used -= g_committed;
    g_committed = 0;
}

static void put(const char *s, size_t n) {
    if (g_used + n > BUF_SIZE) return; /* cannot happen: records are short */
    memcpy(g_buf + g_used, s, n);
    g_used += n;
}
#define PUTS(lit) put(lit, sizeof(lit) - 1)
static void put_cstr(const char *s) { put(s, strlen(s)); }
static void put_u64(uint64_t v) {
    char tmp[24];
    int i = 24;
    do { tmp[--i] = (char)('0' + v % 10); v /= 10; } while (v);
    put(tmp + i, (size_t)(24 - i));
}
static void put_hex(uint64_t v) {
    char tmp[24];
    int i = 24;
    tmp[--i] = '"';
    do { tmp[--i] = "0123456789abcdef"[v & 15]; v >>= 4; } while (v);
    tmp[--i] = 'x';
    tmp[--i] = '0';
    tmp[--i] = '"';
    put(tmp + i, (size_t)(24 - i));
}
/* The inside of a JSON string; bytes outside printable ASCII become '?' or \u00XX. */
static void put_json_body(const char *s) {
    for (; *s && g_used + 8 < BUF_SIZE; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') { char e[2] = {'\\', (char)c}; put(e, 2); }
        else if (c < 0x20) { char e[6] = {'\\', 'u', '0', '0', "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15]}; put(e, 6); }
        else if (c >= 0x80) PUTS("?");
        else put((const char *)&c, 1);
    }
}
static void put_json_str(const char *s) {
    PUTS("\"");
    put_json_body(s);
    PUTS("\"");
}

static uint64_t g_last_t; /* records are in lock order: t never decreases in a file */
static void rec_begin(uint64_t t, int in_mpi) {
    if (t_tid < 0) t_tid = atomic_fetch_add(&g_next_tid, 1);
    t = t >= g_t0 ? t - g_t0 : 0;
    if (t < g_last_t) t = g_last_t;
    g_last_t = t;
    PUTS("{\"t\":");
    put_u64(t);
    if (g_rank) { PUTS(",\"rank\":"); put_u64((uint64_t)g_rank); }
    if (t_tid) { PUTS(",\"thread\":"); put_u64((uint64_t)t_tid); }
    if (in_mpi) PUTS(",\"in_mpi\":true");
}
/* Records are also written out when the oldest unwritten one is older than
 * this: a rank that dies without running the SIGTERM handler (mpirun's
 * SIGKILL after its SIGTERM, on a loaded machine) loses at most this much of
 * its trace, not the whole buffer. Timed by the records' own clock. */
#define FLUSH_AFTER_NS 100000000ull
static uint64_t g_last_flush_t;
static void rec_end(void) {
    PUTS("}\n");
    g_committed = g_used;
    g_records++;
    if (g_used > BUF_SIZE - BUF_SLACK || g_last_t - g_last_flush_t > FLUSH_AFTER_NS) {
        flush_locked();
        g_last_flush_t = g_last_t;
    }
}

/* ------------------------------------------------------------------------ */
/* Which code is "inside MPI": the text of Open MPI's libraries and plugins.  */

#define MAX_TEXT 128
static struct { uintptr_t lo, hi; } g_text[MAX_TEXT];
static int g_ntext;

static int is_mpi_object(const char *name) {
    static const char *const pats[] = {"libmpi", "libopen-pal", "libopen-rte", "/openmpi/", "libpmix",
                                       "libevent", "libhwloc", "libucp", "libuct", "libucs", "libucm",
                                       "libfabric", "libpsm"};
    for (size_t i = 0; i < sizeof pats / sizeof pats[0]; i++)
        if (strstr(name, pats[i])) return 1;
    return 0;
}
static int collect_text(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size; (void)data;
    if (!info->dlpi_name || !is_mpi_object(info->dlpi_name)) return 0;
    for (int i = 0; i < info->dlpi_phnum && g_ntext < MAX_TEXT; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X)) {
            g_text[g_ntext].lo = info->dlpi_addr + ph->p_vaddr;
            g_text[g_ntext].hi = info->dlpi_addr + ph->p_vaddr + ph->p_memsz;
            g_ntext++;
        }
    }
    return 0;
}
static int in_mpi_code(const void *ret) {
    uintptr_t a = (uintptr_t)ret;
    for (int i = 0; i < g_ntext; i++)
        if (a >= g_text[i].lo && a < g_text[i].hi) return 1;
    return 0;
}

/* The MPI wrappers call PMPI with the thread inside MPI (t_depth). */
#define IN_MPI(call) do { t_depth++; _rc = (call); t_depth--; } while (0)
/* A wrapper's whole life: acquire the buffers the body names (one call, one
 * range of lease ids), run the PMPI call, then release them (blocking) or hand
 * them to the request (nonblocking). The body may hold commas. */
#define AROUND(call, after, ...)      \
    do {                              \
        lr_t r = LR_NONE;             \
        if (call_begin()) {           \
            __VA_ARGS__;              \
            r = call_end();           \
        }                             \
        IN_MPI(call);                 \
        after;                        \
    } while (0)
#define BLOCKING(call, ...) AROUND(call, release_lr(r), __VA_ARGS__)
#define NONBLOCKING(call, req, ...) AROUND(call, track(_rc, req, r), __VA_ARGS__)

#include "pmpi/memory.c"
#include "pmpi/datatypes.c"

/* ------------------------------------------------------------------------ */
/* Leases: one "call" takes the lock, acquires a contiguous range of lease ids */

typedef struct { uint64_t first; uint32_t n; } lr_t;
static const lr_t LR_NONE = {0, 0};

#define ACC_SEND "remote_read"
#define ACC_RECV "local_write+remote_write"
#define ACC_BOTH "local_write+remote_read+remote_write"
#define ACC_WIN "local_write+remote_read+remote_write+remote_atomic"
#define ACC_ORIGIN "local_read"
#define ACC_RESULT "local_write"

static int g_in_call;
static uint64_t g_call_t, g_call_first;
static int g_call_saved_errno;

/* Returns 1 when recording (the lock is then held until call_end). */
static int call_begin(void) {
    if (!active()) return 0;
    g_call_saved_errno = errno;
    uint64_t t = now_ns();
    t_guard = 1;
    lock();
    if (!atomic_load(&g_recording)) { unlock(); t_guard = 0; return 0; }
    g_in_call = 1;
    g_call_t = t;
    g_call_first = g_next_lease;
    return 1;
}

static void log_acquire(uintptr_t addr, size_t len, const char *acc) {
    rec_begin(g_call_t, 0);
    PUTS(",\"op\":\"acquire\",\"lease\":");
    put_u64(g_next_lease++);
    PUTS(",\"addr\":");
    put_hex(addr);
    PUTS(",\"len\":");
    put_u64(len);
    PUTS(",\"access\":\"");
    put_cstr(acc);
    PUTS("\"");
    rec_end();
}

static void call_span(const void *addr, size_t len, const char *acc) {
    if (!g_in_call || !len || (uintptr_t)addr + len < (uintptr_t)addr) return;
    log_acquire((uintptr_t)addr, len, acc);
}

static void call_buf(const void *buf, MPI_Aint count, MPI_Datatype dt, const char *acc) {
    if (!g_in_call || count <= 0 || buf == MPI_IN_PLACE || dt == MPI_DATATYPE_NULL) return;
    g_nblk = 0;
    g_budget = WALK_BUDGET;
    g_capped = 0;
    walk((intptr_t)buf, dt, count, 0);
    normalise_blocks();
    if (g_capped) g_capped_types++;
    for (int i = 0; i < g_nblk; i++) log_acquire(g_blk[i].addr, g_blk[i].len, acc);
}

static lr_t call_end(void) {
    lr_t r = {g_call_first, (uint32_t)(g_next_lease - g_call_first)};
    g_in_call = 0;
    unlock();
    t_guard = 0;
    errno = g_call_saved_errno;
    return r;
}

static void release_locked(lr_t r, uint64_t t) {
    for (uint32_t i = 0; i < r.n; i++) {
        rec_begin(t, 0);
        PUTS(",\"op\":\"release\",\"lease\":");
        put_u64(r.first + i);
        rec_end();
    }
}

static void release_lr(lr_t r) {
    if (r.n == 0) return;
    int saved = errno;
    uint64_t t = now_ns();
    int g = t_guard;
    t_guard = 1;
    lock();
    if (atomic_load(&g_recording)) release_locked(r, t);
    unlock();
    t_guard = g;
    errno = saved;
}

/* One buffer, acquired before a call. */
static lr_t acq1(const void *buf, MPI_Aint count, MPI_Datatype dt, const char *acc) {
    if (!call_begin()) return LR_NONE;
    call_buf(buf, count, dt, acc);
    return call_end();
}


#include "pmpi/requests.c"
#include "pmpi/rma.c"

/* Start and end of recording                                                 */

static int env_int(const char *name, long *out) {
    const char *s = getenv(name);
    if (!s || !*s) return 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end) return 0;
    *out = v;
    return 1;
}

/* Reads /proc/self/cmdline into buf, arguments joined by spaces. */
static void read_cmdline(char *buf, size_t cap, const char **argv0_base) {
    buf[0] = 0;
    *argv0_base = buf;
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    ssize_t n = read(fd, buf, cap - 1);
    close(fd);
    if (n <= 0) return;
    buf[n] = 0;
    const char *slash = strrchr(buf, '/');
    static char base[256];
    size_t i = 0;
    for (const char *s = slash ? slash + 1 : buf; *s && i + 1 < sizeof base; s++) base[i++] = *s;
    base[i] = 0;
    *argv0_base = base;
    for (ssize_t j = 0; j < n - 1; j++)
        if (!buf[j]) buf[j] = ' ';
}

static void iso_date(char *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t secs = ts.tv_sec, days = secs / 86400, rem = secs % 86400;
    /* civil_from_days (H. Hinnant) */
    int64_t z = days + 719468, era = (z >= 0 ? z : z - 146096) / 146097;
    int64_t doe = z - era * 146097, yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t y = yoe + era * 400, doy = doe - (365 * yoe + yoe / 4 - yoe / 100), mp = (5 * doy + 2) / 153;
    int64_t d = doy - (153 * mp + 2) / 5 + 1, m = mp < 10 ? mp + 3 : mp - 9;
    if (m <= 2) y++;
    int64_t v[6] = {y, m, d, rem / 3600, rem / 60 % 60, rem % 60};
    const int w[6] = {4, 2, 2, 2, 2, 2};
    const char sep[6] = {'-', '-', 'T', ':', ':', 'Z'};
    char *p = out;
    for (int i = 0; i < 6; i++) {
        for (int k = w[i] - 1; k >= 0; k--) {
            int64_t q = v[i];
            for (int r = 0; r < k; r++) q /= 10;
            *p++ = (char)('0' + q % 10);
        }
        *p++ = sep[i];
    }
    *p = 0;
}

static void write_header(void) {
    static char cmdline[8192];
    const char *argv0;
    read_cmdline(cmdline, sizeof cmdline, &argv0);
    const char *program = getenv("MRCACHE_PROGRAM");
    const char *version = getenv("MRCACHE_PROGRAM_VERSION");
    const char *command = getenv("MRCACHE_COMMAND");
    const char *desc = getenv("MRCACHE_DESCRIPTION");
    char date[32];
    iso_date(date);
    char libver[MPI_MAX_LIBRARY_VERSION_STRING] = "";
    int len = 0;
    PMPI_Get_library_version(libver, &len);
    char *nl = strchr(libver, '\n');
    if (nl) *nl = 0;
    char *comma = strchr(libver, ',');
    if (comma) *comma = 0;

    PUTS("{\"mrcache_trace\":1,\"source\":\"recorder\",\"description\":\"");
    if (desc && *desc) {
        /* the user's words, then what the recorder records */
        put_json_body(desc);
        PUTS(". ");
    }
    PUTS("PMPI recording: user buffers of MPI calls as acquire/release (one lease per contiguous block), "
         "malloc-family alloc/free and mmap-family release events");
    PUTS(" of at least ");
    put_u64(g_threshold);
    PUTS(" bytes, ");
    if (g_include_init) PUTS("from MPI_Init entry"); else PUTS("from MPI_Init return");
    PUTS(" to MPI_Finalize\"");
    PUTS(",\"program\":");
    put_json_str(program && *program ? program : argv0);
    if (version && *version) { PUTS(",\"program_version\":"); put_json_str(version); }
    PUTS(",\"command\":");
    put_json_str(command && *command ? command : cmdline);
    PUTS(",\"ranks\":");
    put_u64((uint64_t)g_size);
    PUTS(",\"rank\":");
    put_u64((uint64_t)g_rank);
    PUTS(",\"page_size\":");
    put_u64((uint64_t)sysconf(_SC_PAGESIZE));
    PUTS(",\"date\":");
    put_json_str(date);
    PUTS(",\"recorder\":\"mrcache-pmpi " MRC_RECORDER_VERSION "; ");
    for (const char *s = libver; *s; s++)
        if (*s >= 0x20 && *s < 0x7f && *s != '"' && *s != '\\') put(s, 1);
    PUTS("; threshold ");
    put_u64(g_threshold);
    PUTS("\"}\n");
    g_committed = g_used;
}

static struct sigaction g_old_term, g_old_int;
static void on_signal(int sig);

/* Writes "<MRCACHE_TRACE_DIR>/rank-<g_rank><suffix>" into path (1100 bytes:
   g_dir is shorter than 1024, checked where it is set). No allocation: this runs
   inside MPI_Init and at exit, where malloc may be interposed. */
static void rank_path(char *path, const char *suffix) {
    size_t n = strlen(g_dir);
    memcpy(path, g_dir, n);
    memcpy(path + n, "/rank-", 6);
    n += 6;
    char num[16];
    int i = 16;
    unsigned r = (unsigned)g_rank;
    do { num[--i] = (char)('0' + r % 10); r /= 10; } while (r);
    memcpy(path + n, num + i, (size_t)(16 - i));
    n += (size_t)(16 - i);
    memcpy(path + n, suffix, strlen(suffix) + 1);
}

static void open_trace(int rank, int size) {
    char path[1100];
    g_rank = rank;
    g_size = size;
    rank_path(path, ".jsonl");
    g_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (g_fd < 0) {
        static const char msg[] = "libmrcache_pmpi: cannot create the trace file in MRCACHE_TRACE_DIR; not recording\n";
        write_all(2, msg, sizeof msg - 1);
        return;
    }
    g_used = g_committed = 0;
    write_header();
    flush_locked();
    atomic_store(&g_recording, 1);
}

static void write_stats(void) {
    char path[1100];
    rank_path(path, ".stats.json");
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return;
    g_used = g_committed = 0;
    PUTS("{\"records\":");
    put_u64(g_records);
    PUTS(",\"capped_datatypes\":");
    put_u64(g_capped_types);
    PUTS(",\"request_table_overflows\":");
    put_u64(g_req_overflow);
    PUTS(",\"window_table_overflows\":");
    put_u64(g_win_overflow);
    PUTS(",\"write_errors\":");
    put_u64(g_write_errors);
    PUTS(",\"recorder_ns\":");
    put_u64(g_self_ns);
    PUTS(",\"recorded_ns\":");
    put_u64(now_ns() - g_t0);
    PUTS(",\"bytes_dropped\":");
    put_u64(g_bytes_dropped);
    PUTS(",\"open_requests\":");
    put_u64(g_nrq);
    PUTS("}\n");
    write_all(fd, g_buf, g_used);
    g_used = g_committed = 0;
    close(fd);
}

/* Stops recording: flush, close, write the stats. */
static void stop_recording(void) {
    if (!atomic_load(&g_recording)) return;
    int g = t_guard;
    t_guard = 1;
    lock();
    if (atomic_exchange(&g_recording, 0)) {
        flush_locked();
        close(g_fd);
        g_fd = -1;
        write_stats();
    }
    unlock();
    t_guard = g;
}

/* SIGTERM/SIGINT: keep the trace, then die as the signal says. Bounded: if the
 * lock cannot be had (this thread was interrupted inside the recorder), write
 * the complete records that are buffered. */
static void on_signal(int sig) {
    int saved = errno;
    int locked = try_lock_bounded(1000);
    if (atomic_exchange(&g_recording, 0) && g_fd >= 0) {
        write_all(g_fd, g_buf, g_committed);
        g_used = g_committed = 0;
        close(g_fd);
        g_fd = -1;
    }
    if (locked) unlock();
    sigaction(sig, sig == SIGTERM ? &g_old_term : &g_old_int, NULL);
    errno = saved;
    raise(sig);
}

static void at_fork_child(void) {
    /* The child must not write into the parent's trace. */
    atomic_store(&g_recording, 0);
    g_fd = -1;
    atomic_flag_clear(&g_lock);
}

__attribute__((constructor)) static void mrc_init(void) {
    t_tid = 0;
    resolve_real();
    const char *dir = getenv("MRCACHE_TRACE_DIR");
    if (dir && *dir && strlen(dir) < sizeof g_dir) memcpy(g_dir, dir, strlen(dir) + 1);
    long v;
    if (env_int("MRCACHE_THRESHOLD", &v) && v >= 0) g_threshold = (size_t)v;
    g_include_init = env_int("MRCACHE_INCLUDE_INIT", &v) && v == 1;
    pthread_atfork(NULL, NULL, at_fork_child);
}

__attribute__((destructor)) static void mrc_fini(void) { stop_recording(); }

static void install_signal_handlers(void) {
    struct sigaction sa, cur;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGTERM, NULL, &cur) == 0 && cur.sa_handler == SIG_DFL) sigaction(SIGTERM, &sa, &g_old_term);
    if (sigaction(SIGINT, NULL, &cur) == 0 && cur.sa_handler == SIG_DFL) sigaction(SIGINT, &sa, &g_old_int);
}

/* Outside the lock: dl_iterate_phdr takes the loader's lock. */
static void refresh_mpi_text(void) {
    g_ntext = 0;
    dl_iterate_phdr(collect_text, NULL);
}

static void init_begin(void) {
    g_t0 = now_ns();
    if (!g_dir[0] || !g_include_init) return;
    /* --include-init: rank and size come from the launcher's environment
     * (MPI_Get_library_version, for the header, may be called before MPI_Init). */
    long rank, size;
    if ((env_int("OMPI_COMM_WORLD_RANK", &rank) || env_int("PMIX_RANK", &rank) || env_int("PMI_RANK", &rank)) &&
        (env_int("OMPI_COMM_WORLD_SIZE", &size) || env_int("PMI_SIZE", &size))) {
        int g = t_guard;
        t_guard = 1;
        refresh_mpi_text();
        install_signal_handlers();
        lock();
        open_trace((int)rank, (int)size);
        unlock();
        t_guard = g;
    }
}

static void init_end(void) {
    if (!g_dir[0]) return;
    int rank = 0, size = 1;
    int g = t_guard;
    t_guard = 1;
    PMPI_Comm_rank(MPI_COMM_WORLD, &rank);
    PMPI_Comm_size(MPI_COMM_WORLD, &size);
    refresh_mpi_text(); /* MPI_Init loaded Open MPI's plugins */
    if (!atomic_load(&g_recording)) {
        install_signal_handlers();
        lock();
        open_trace(rank, size);
        unlock();
    }
    t_guard = g;
}

/* ------------------------------------------------------------------------ */
/* MPI wrappers                                                               */


MRC_EXPORT int MPI_Init(int *argc, char ***argv) {
    int _rc;
    init_begin();
    IN_MPI(PMPI_Init(argc, argv));
    if (_rc == MPI_SUCCESS) init_end();
    return _rc;
}

MRC_EXPORT int MPI_Init_thread(int *argc, char ***argv, int required, int *provided) {
    int _rc;
    init_begin();
    IN_MPI(PMPI_Init_thread(argc, argv, required, provided));
    if (_rc == MPI_SUCCESS) init_end();
    return _rc;
}

MRC_EXPORT int MPI_Finalize(void) {
    stop_recording();
    return PMPI_Finalize();
}

MRC_EXPORT int MPI_Abort(MPI_Comm comm, int code) {
    stop_recording();
    return PMPI_Abort(comm, code);
}

#include "pmpi/p2p.c"
#include "pmpi/collectives.c"
