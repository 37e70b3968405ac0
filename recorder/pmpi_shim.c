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
static void rec_end(void) {
    PUTS("}\n");
    g_committed = g_used;
    g_records++;
    if (g_used > BUF_SIZE - BUF_SLACK) flush_locked();
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

/* ------------------------------------------------------------------------ */
/* Memory events                                                              */

#define EV_ALLOC "\"op\":\"alloc\""
#define EV_FREE "\"op\":\"free\""
#define EV_MUNMAP "\"op\":\"release_event\",\"kind\":\"munmap\""
#define EV_MREMAP "\"op\":\"release_event\",\"kind\":\"mremap_source\""
#define EV_DONTNEED "\"op\":\"release_event\",\"kind\":\"madvise_dontneed\""
#define EV_MFREE "\"op\":\"release_event\",\"kind\":\"madvise_free\""
#define EV_MREMOVE "\"op\":\"release_event\",\"kind\":\"madvise_remove\""
#define EV_FIXED "\"op\":\"release_event\",\"kind\":\"map_fixed_over\""
#define EV_BRK "\"op\":\"release_event\",\"kind\":\"brk_shrink\""
#define EV_SHMDT "\"op\":\"release_event\",\"kind\":\"shmdt\""

static inline int active(void) { return atomic_load_explicit(&g_recording, memory_order_relaxed) && !t_guard; }

static void mem_event(const char *ev, uintptr_t addr, size_t len, const void *caller) {
    if (len == 0 || addr + len < addr) return;
    int saved = errno;
    int in_mpi = t_depth > 0 || in_mpi_code(caller);
    uint64_t t = now_ns();
    t_guard = 1;
    lock();
    if (atomic_load(&g_recording)) {
        rec_begin(t, in_mpi);
        PUTS(",");
        put_cstr(ev);
        PUTS(",\"addr\":");
        put_hex(addr);
        PUTS(",\"len\":");
        put_u64(len);
        rec_end();
    }
    unlock();
    t_guard = 0;
    errno = saved;
}

/* glibc chunk header (malloc/malloc.c): size field before the user pointer,
 * low bits PREV_INUSE=1, IS_MMAPPED=2, NON_MAIN_ARENA=4; for an mmapped chunk
 * prev_size holds the offset of the chunk in its mapping. */
#define CHUNK_IS_MMAPPED 2u
struct chunk_map { uintptr_t block; size_t len; int mmapped; size_t usable; };
static struct chunk_map chunk_of(void *p) {
    struct chunk_map m = {0, 0, 0, 0};
    size_t sz = ((size_t *)p)[-1];
    size_t csz = sz & ~(size_t)7;
    if (sz & CHUNK_IS_MMAPPED) {
        size_t prev = ((size_t *)p)[-2];
        m.mmapped = 1;
        m.block = (uintptr_t)p - 2 * sizeof(size_t) - prev;
        m.len = prev + csz;
        m.usable = csz - 2 * sizeof(size_t);
    } else {
        m.usable = csz - sizeof(size_t);
    }
    return m;
}

static void brk_check(uintptr_t before, const void *caller) {
    uintptr_t after = (uintptr_t)__curbrk;
    if (after && before && after < before) mem_event(EV_BRK, after, before - after, caller);
}

/* The malloc family. */
MRC_EXPORT void *malloc(size_t n) {
    void *p = __libc_malloc(n);
    if (p && active() && n >= g_threshold) mem_event(EV_ALLOC, (uintptr_t)p, n, __builtin_return_address(0));
    return p;
}

MRC_EXPORT void free(void *p) {
    if (!p) return;
    if (!active()) { __libc_free(p); return; }
    const void *caller = __builtin_return_address(0);
    struct chunk_map m = chunk_of(p);
    uintptr_t brk0 = (uintptr_t)__curbrk;
    __libc_free(p);
    if (m.usable >= g_threshold) mem_event(EV_FREE, (uintptr_t)p, m.usable, caller);
    if (m.mmapped) mem_event(EV_MUNMAP, m.block, m.len, caller);
    else brk_check(brk0, caller);
}

MRC_EXPORT void *calloc(size_t n, size_t sz) {
    void *p = __libc_calloc(n, sz);
    if (p && active() && n * sz >= g_threshold) mem_event(EV_ALLOC, (uintptr_t)p, n * sz, __builtin_return_address(0));
    return p;
}

static void *realloc_rec(void *old, size_t n, const void *caller) {
    if (!old) {
        void *p = __libc_malloc(n);
        if (p && active() && n >= g_threshold) mem_event(EV_ALLOC, (uintptr_t)p, n, caller);
        return p;
    }
    if (!active()) return __libc_realloc(old, n);
    struct chunk_map m = chunk_of(old);
    uintptr_t brk0 = (uintptr_t)__curbrk;
    void *p = __libc_realloc(old, n);
    if (n == 0 && !p) { /* realloc(p, 0) freed it */
        if (m.usable >= g_threshold) mem_event(EV_FREE, (uintptr_t)old, m.usable, caller);
        if (m.mmapped) mem_event(EV_MUNMAP, m.block, m.len, caller);
        else brk_check(brk0, caller);
        return p;
    }
    if (!p) return p; /* failed: old is untouched */
    if (p != old || m.usable >= g_threshold || n >= g_threshold) {
        if (m.usable >= g_threshold) mem_event(EV_FREE, (uintptr_t)old, m.usable, caller);
        if (n >= g_threshold) mem_event(EV_ALLOC, (uintptr_t)p, n, caller);
    }
    if (m.mmapped) {
        /* glibc mremaps the chunk, or mallocs + copies + munmaps it. */
        struct chunk_map q = chunk_of(p);
        if (!q.mmapped) mem_event(EV_MUNMAP, m.block, m.len, caller);
        else if (q.block != m.block) mem_event(EV_MREMAP, m.block, m.len, caller);
        else if (q.len < m.len) mem_event(EV_MREMAP, m.block + q.len, m.len - q.len, caller);
    } else {
        brk_check(brk0, caller);
    }
    return p;
}

MRC_EXPORT void *realloc(void *old, size_t n) { return realloc_rec(old, n, __builtin_return_address(0)); }

MRC_EXPORT void *reallocarray(void *old, size_t n, size_t sz) {
    size_t bytes;
    if (__builtin_mul_overflow(n, sz, &bytes)) { errno = ENOMEM; return NULL; }
    return realloc_rec(old, bytes, __builtin_return_address(0));
}

static void *aligned_rec(size_t align, size_t n, const void *caller) {
    uintptr_t brk0 = (uintptr_t)__curbrk;
    void *p = __libc_memalign(align, n);
    if (p && active()) {
        if (n >= g_threshold) mem_event(EV_ALLOC, (uintptr_t)p, n, caller);
        brk_check(brk0, caller);
    }
    return p;
}

MRC_EXPORT void *memalign(size_t align, size_t n) { return aligned_rec(align, n, __builtin_return_address(0)); }
MRC_EXPORT void *aligned_alloc(size_t align, size_t n) { return aligned_rec(align, n, __builtin_return_address(0)); }

MRC_EXPORT int posix_memalign(void **out, size_t align, size_t n) {
    if (align % sizeof(void *) != 0 || (align & (align - 1)) != 0 || align == 0) return EINVAL;
    int saved = errno;
    void *p = aligned_rec(align, n, __builtin_return_address(0));
    if (!p) { errno = saved; return ENOMEM; }
    *out = p;
    return 0;
}

MRC_EXPORT void *valloc(size_t n) {
    void *p = __libc_valloc(n);
    if (p && active() && n >= g_threshold) mem_event(EV_ALLOC, (uintptr_t)p, n, __builtin_return_address(0));
    return p;
}

MRC_EXPORT void *pvalloc(size_t n) {
    void *p = __libc_pvalloc(n);
    if (p && active() && n >= g_threshold) mem_event(EV_ALLOC, (uintptr_t)p, n, __builtin_return_address(0));
    return p;
}

/* The mmap family: real functions from dlsym(RTLD_NEXT), raw syscalls until then. */
static void *(*real_mmap)(void *, size_t, int, int, int, off_t);
static void *(*real_mmap64)(void *, size_t, int, int, int, off_t);
static int (*real_munmap)(void *, size_t);
static void *(*real_mremap)(void *, size_t, size_t, int, ...);
static int (*real_madvise)(void *, size_t, int);
static int (*real_brk)(void *);
static void *(*real_sbrk)(intptr_t);
static void *(*real_shmat)(int, const void *, int);
static int (*real_shmdt)(const void *);

static void resolve_real(void) {
    /* dlsym may call calloc (handled) or mmap (raw syscall until set). */
    real_mmap = (void *(*)(void *, size_t, int, int, int, off_t))dlsym(RTLD_NEXT, "mmap");
    real_mmap64 = (void *(*)(void *, size_t, int, int, int, off_t))dlsym(RTLD_NEXT, "mmap64");
    real_munmap = (int (*)(void *, size_t))dlsym(RTLD_NEXT, "munmap");
    real_mremap = (void *(*)(void *, size_t, size_t, int, ...))dlsym(RTLD_NEXT, "mremap");
    real_madvise = (int (*)(void *, size_t, int))dlsym(RTLD_NEXT, "madvise");
    real_brk = (int (*)(void *))dlsym(RTLD_NEXT, "brk");
    real_sbrk = (void *(*)(intptr_t))dlsym(RTLD_NEXT, "sbrk");
    real_shmat = (void *(*)(int, const void *, int))dlsym(RTLD_NEXT, "shmat");
    real_shmdt = (int (*)(const void *))dlsym(RTLD_NEXT, "shmdt");
}

static void *mmap_common(void *(*real)(void *, size_t, int, int, int, off_t), void *addr, size_t len, int prot,
                         int flags, int fd, off_t off, const void *caller) {
    void *p = real ? real(addr, len, prot, flags, fd, off)
                   : (void *)syscall(SYS_mmap, addr, len, prot, flags, fd, off);
    if (p != MAP_FAILED && active()) {
        if ((flags & MAP_FIXED) && !(flags & MAP_FIXED_NOREPLACE))
            mem_event(EV_FIXED, (uintptr_t)p, len, caller);
        else if (len >= g_threshold)
            mem_event(EV_ALLOC, (uintptr_t)p, len, caller);
    }
    return p;
}

MRC_EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    return mmap_common(real_mmap, addr, len, prot, flags, fd, off, __builtin_return_address(0));
}
MRC_EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
    return mmap_common(real_mmap64, addr, len, prot, flags, fd, off, __builtin_return_address(0));
}

MRC_EXPORT int munmap(void *addr, size_t len) {
    int rc = real_munmap ? real_munmap(addr, len) : (int)syscall(SYS_munmap, addr, len);
    if (rc == 0 && active()) mem_event(EV_MUNMAP, (uintptr_t)addr, len, __builtin_return_address(0));
    return rc;
}

MRC_EXPORT void *mremap(void *old, size_t oldlen, size_t newlen, int flags, ...) {
    void *newaddr = NULL;
    if (flags & MREMAP_FIXED) {
        va_list ap;
        va_start(ap, flags);
        newaddr = va_arg(ap, void *);
        va_end(ap);
    }
    void *p = real_mremap ? real_mremap(old, oldlen, newlen, flags, newaddr)
                          : (void *)syscall(SYS_mremap, old, oldlen, newlen, flags, newaddr);
    if (p != MAP_FAILED && active() && oldlen > 0) {
        const void *caller = __builtin_return_address(0);
        if (flags & MREMAP_FIXED) mem_event(EV_FIXED, (uintptr_t)p, newlen, caller);
        if (p != old) mem_event(EV_MREMAP, (uintptr_t)old, oldlen, caller);
        else if (newlen < oldlen) mem_event(EV_MREMAP, (uintptr_t)old + newlen, oldlen - newlen, caller);
    }
    return p;
}

MRC_EXPORT int madvise(void *addr, size_t len, int advice) {
    int rc = real_madvise ? real_madvise(addr, len, advice) : (int)syscall(SYS_madvise, addr, len, advice);
    if (rc == 0 && active()) {
        const char *ev = NULL;
        switch (advice) {
        case MADV_DONTNEED: ev = EV_DONTNEED; break;
#ifdef MADV_DONTNEED_LOCKED
        case MADV_DONTNEED_LOCKED: ev = EV_DONTNEED; break;
#endif
#ifdef MADV_FREE
        case MADV_FREE: ev = EV_MFREE; break;
#endif
        case MADV_REMOVE: ev = EV_MREMOVE; break;
        default: break;
        }
        if (ev) mem_event(ev, (uintptr_t)addr, len, __builtin_return_address(0));
    }
    return rc;
}

MRC_EXPORT int brk(void *addr) {
    uintptr_t before = (uintptr_t)__curbrk;
    int rc = real_brk ? real_brk(addr) : (int)syscall(SYS_brk, addr);
    if (rc == 0 && active()) brk_check(before, __builtin_return_address(0));
    return rc;
}

MRC_EXPORT void *sbrk(intptr_t incr) {
    extern void *__sbrk(intptr_t);
    void *old = real_sbrk ? real_sbrk(incr) : __sbrk(incr);
    if (old != (void *)-1 && incr < 0 && active())
        mem_event(EV_BRK, (uintptr_t)old + (uintptr_t)incr, (size_t)(-incr), __builtin_return_address(0));
    return old;
}

/* shmat/shmdt: remember each attachment's size so that shmdt can say how much went. */
#define SHM_CAP 256
static struct { uintptr_t addr; size_t len; } g_shm[SHM_CAP];

MRC_EXPORT void *shmat(int id, const void *addr, int flags) {
    void *p = real_shmat ? real_shmat(id, addr, flags) : (void *)syscall(SYS_shmat, id, addr, flags);
    if (p != (void *)-1 && atomic_load(&g_recording)) {
        struct shmid_ds ds;
        int saved = errno;
        if (shmctl(id, IPC_STAT, &ds) == 0) {
            lock();
            for (int i = 0; i < SHM_CAP; i++)
                if (!g_shm[i].addr) { g_shm[i].addr = (uintptr_t)p; g_shm[i].len = ds.shm_segsz; break; }
            unlock();
        }
        errno = saved;
    }
    return p;
}

MRC_EXPORT int shmdt(const void *addr) {
    int rc = real_shmdt ? real_shmdt(addr) : (int)syscall(SYS_shmdt, addr);
    if (rc == 0 && atomic_load(&g_recording)) {
        size_t len = 0;
        lock();
        for (int i = 0; i < SHM_CAP; i++)
            if (g_shm[i].addr == (uintptr_t)addr) { len = g_shm[i].len; g_shm[i].addr = 0; break; }
        unlock();
        if (len && active()) mem_event(EV_SHMDT, (uintptr_t)addr, len, __builtin_return_address(0));
    }
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Datatype flattening                                                        */
/*
 * A buffer (base, count, datatype) becomes a list of contiguous blocks by
 * walking the datatype's constructor tree (MPI_Type_get_envelope /
 * get_contents), so that MPI_BOTTOM plus absolute displacements (HPL) gives the
 * real blocks instead of one range from address 0. Limits, all documented in
 * traces/README.md: at most MAX_BLOCKS blocks per buffer (adjacent blocks are
 * merged; past the cap a new block widens the last one to cover it); at most
 * WALK_BUDGET constructor visits per buffer and MAX_DEPTH levels, past which the
 * rest of the buffer is covered by its bounding range; darray and types whose
 * contents exceed the static arrays are covered by their bounding range.
 */
#define MAX_BLOCKS 256
#define WALK_BUDGET 65536
#define MAX_DEPTH 8
#define CAP_I 2048
#define CAP_A 1024
#define CAP_D 512

typedef struct { uintptr_t addr; size_t len; } blk_t;
static blk_t g_blk[MAX_BLOCKS];
static int g_nblk;
static long g_budget;
static int g_capped;
static int s_ints[MAX_DEPTH][CAP_I];
static MPI_Aint s_aints[MAX_DEPTH][CAP_A];
static MPI_Datatype s_types[MAX_DEPTH][CAP_D];

static void emit(intptr_t addr, intptr_t len) {
    if (len <= 0) return;
    uintptr_t a = (uintptr_t)addr, e = (uintptr_t)addr + (uintptr_t)len;
    if (e < a) return;
    if (g_nblk) {
        blk_t *l = &g_blk[g_nblk - 1];
        if (a >= l->addr && a <= l->addr + l->len) {
            if (e > l->addr + l->len) l->len = e - l->addr;
            return;
        }
    }
    if (g_nblk == MAX_BLOCKS) {
        blk_t *l = &g_blk[g_nblk - 1];
        uintptr_t lo = a < l->addr ? a : l->addr, hi = e > l->addr + l->len ? e : l->addr + l->len;
        l->addr = lo;
        l->len = hi - lo;
        g_capped = 1;
        return;
    }
    g_blk[g_nblk].addr = a;
    g_blk[g_nblk].len = (size_t)len;
    g_nblk++;
}

static int is_named(MPI_Datatype dt) {
    int ni, na, nd, comb;
    if (PMPI_Type_get_envelope(dt, &ni, &na, &nd, &comb) != MPI_SUCCESS) return 1;
    return comb == MPI_COMBINER_NAMED;
}

static void walk(intptr_t base, MPI_Datatype dt, MPI_Aint count, int depth) {
    MPI_Count size;
    MPI_Aint lb, ext, tlb, text;
    if (count <= 0 || dt == MPI_DATATYPE_NULL) return;
    if (PMPI_Type_size_x(dt, &size) != MPI_SUCCESS || size <= 0) return;
    if (PMPI_Type_get_extent(dt, &lb, &ext) != MPI_SUCCESS) return;
    if (PMPI_Type_get_true_extent(dt, &tlb, &text) != MPI_SUCCESS) return;
    g_budget--;
    if (size == text && ext == text) { emit(base + tlb, (intptr_t)(count * text)); return; }
    if (count == 1 && size == text) { emit(base + tlb, text); return; }
    /* The bounding range of all `count` elements. */
    intptr_t blo = base + tlb + (ext < 0 ? (count - 1) * ext : 0);
    intptr_t bhi = base + tlb + text + (ext > 0 ? (count - 1) * ext : 0);
    int ni, na, nd, comb;
    if (depth >= MAX_DEPTH || g_budget <= 0 || PMPI_Type_get_envelope(dt, &ni, &na, &nd, &comb) != MPI_SUCCESS ||
        comb == MPI_COMBINER_NAMED || comb == MPI_COMBINER_DARRAY || ni > CAP_I || na > CAP_A || nd > CAP_D) {
        if (depth >= MAX_DEPTH || g_budget <= 0 || ni > CAP_I || na > CAP_A || nd > CAP_D) g_capped = 1;
        emit(blo, bhi - blo);
        return;
    }
    int *I = s_ints[depth];
    MPI_Aint *A = s_aints[depth];
    MPI_Datatype *D = s_types[depth];
    if (PMPI_Type_get_contents(dt, ni, na, nd, I, A, D) != MPI_SUCCESS) { emit(blo, bhi - blo); return; }
    MPI_Aint oe = 0, olb = 0;
    if (nd > 0) PMPI_Type_get_extent(D[0], &olb, &oe);
    for (MPI_Aint i = 0; i < count; i++) {
        intptr_t e = base + i * ext;
        if (g_budget <= 0) {
            /* Out of budget: the rest of the buffer is one bounding range. */
            g_capped = 1;
            intptr_t lo = e + tlb;
            emit(lo < blo ? blo : lo, bhi - (lo < blo ? blo : lo));
            break;
        }
        switch (comb) {
        case MPI_COMBINER_DUP:
        case MPI_COMBINER_RESIZED: walk(e, D[0], 1, depth + 1); break;
        case MPI_COMBINER_CONTIGUOUS: walk(e, D[0], I[0], depth + 1); break;
        case MPI_COMBINER_VECTOR:
            for (int j = 0; j < I[0] && g_budget > 0; j++) walk(e + (intptr_t)j * I[2] * oe, D[0], I[1], depth + 1);
            break;
        case MPI_COMBINER_HVECTOR:
            for (int j = 0; j < I[0] && g_budget > 0; j++) walk(e + (intptr_t)j * A[0], D[0], I[1], depth + 1);
            break;
        case MPI_COMBINER_INDEXED:
            for (int j = 0; j < I[0] && g_budget > 0; j++) walk(e + (intptr_t)I[1 + I[0] + j] * oe, D[0], I[1 + j], depth + 1);
            break;
        case MPI_COMBINER_HINDEXED:
            for (int j = 0; j < I[0] && g_budget > 0; j++) walk(e + A[j], D[0], I[1 + j], depth + 1);
            break;
        case MPI_COMBINER_INDEXED_BLOCK:
            for (int j = 0; j < I[0] && g_budget > 0; j++) walk(e + (intptr_t)I[2 + j] * oe, D[0], I[1], depth + 1);
            break;
        case MPI_COMBINER_HINDEXED_BLOCK:
            for (int j = 0; j < I[0] && g_budget > 0; j++) walk(e + A[j], D[0], I[1], depth + 1);
            break;
        case MPI_COMBINER_STRUCT:
            for (int j = 0; j < I[0] && g_budget > 0; j++) walk(e + A[j], D[j], I[1 + j], depth + 1);
            break;
        case MPI_COMBINER_SUBARRAY: {
            int nd2 = I[0];
            const int *sizes = &I[1], *subs = &I[1 + nd2], *starts = &I[1 + 2 * nd2];
            int order = I[1 + 3 * nd2];
            if (nd2 <= 0 || nd2 > 32) { emit(blo, bhi - blo); break; }
            MPI_Aint stride[32];
            int fast = order == MPI_ORDER_C ? nd2 - 1 : 0;
            if (order == MPI_ORDER_C) {
                stride[nd2 - 1] = oe;
                for (int d = nd2 - 2; d >= 0; d--) stride[d] = stride[d + 1] * sizes[d + 1];
            } else {
                stride[0] = oe;
                for (int d = 1; d < nd2; d++) stride[d] = stride[d - 1] * sizes[d - 1];
            }
            int idx[32] = {0};
            for (int d = 0; d < nd2; d++) if (subs[d] <= 0) goto subarray_done;
            for (;;) {
                if (g_budget <= 0) { g_capped = 1; emit(blo, bhi - blo); break; }
                MPI_Aint off = 0;
                for (int d = 0; d < nd2; d++) off += (MPI_Aint)(starts[d] + (d == fast ? 0 : idx[d])) * stride[d];
                walk(e + off, D[0], subs[fast], depth + 1);
                /* odometer over the slow dimensions */
                int d = order == MPI_ORDER_C ? nd2 - 2 : 1;
                int step = order == MPI_ORDER_C ? -1 : 1;
                for (; d >= 0 && d < nd2; d += step) {
                    if (++idx[d] < subs[d]) break;
                    idx[d] = 0;
                }
                if (d < 0 || d >= nd2) break;
            }
        subarray_done:
            break;
        }
        default: emit(blo, bhi - blo); i = count; break; /* whole bounding range once */
        }
    }
    for (int j = 0; j < nd; j++)
        if (!is_named(D[j])) PMPI_Type_free(&D[j]);
}

/* Sorts the blocks and merges overlapping or touching ones. */
static void normalise_blocks(void) {
    for (int i = 1; i < g_nblk; i++) {
        blk_t b = g_blk[i];
        int j = i;
        while (j > 0 && g_blk[j - 1].addr > b.addr) { g_blk[j] = g_blk[j - 1]; j--; }
        g_blk[j] = b;
    }
    int out = 0;
    for (int i = 0; i < g_nblk; i++) {
        if (out && g_blk[i].addr <= g_blk[out - 1].addr + g_blk[out - 1].len) {
            uintptr_t e = g_blk[i].addr + g_blk[i].len;
            if (e > g_blk[out - 1].addr + g_blk[out - 1].len) g_blk[out - 1].len = e - g_blk[out - 1].addr;
        } else {
            g_blk[out++] = g_blk[i];
        }
    }
    g_nblk = out;
}

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

/* ------------------------------------------------------------------------ */
/* Requests: MPI_Request -> the leases it holds (and, if persistent, its buffer) */

#define RQ_CAP (1u << 16)
typedef struct {
    MPI_Request key; /* NULL: empty slot */
    lr_t leases;     /* held while the request is active */
    int persistent;
    const void *buf;
    int count;
    MPI_Datatype type; /* a dup of the user's type (or a named type) */
    const char *acc;
} rq_t;
static rq_t g_rq[RQ_CAP];
static unsigned g_nrq;

static unsigned rq_hash(MPI_Request k) {
    uint64_t x = (uint64_t)(uintptr_t)k;
    x ^= x >> 29;
    x *= 0x9e3779b97f4a7c15ull;
    return (unsigned)(x >> 40) & (RQ_CAP - 1);
}
static rq_t *rq_find(MPI_Request k) {
    if (!g_nrq) return NULL;
    for (unsigned i = rq_hash(k), n = 0; n < RQ_CAP; i = (i + 1) & (RQ_CAP - 1), n++) {
        if (g_rq[i].key == k) return &g_rq[i];
        if (!g_rq[i].key) return NULL;
    }
    return NULL;
}
static void rq_delete(rq_t *e) {
    /* backward-shift deletion for linear probing */
    unsigned i = (unsigned)(e - g_rq);
    g_rq[i].key = NULL;
    g_nrq--;
    for (unsigned j = (i + 1) & (RQ_CAP - 1), n = 0; n < RQ_CAP; j = (j + 1) & (RQ_CAP - 1), n++) {
        if (!g_rq[j].key) break;
        unsigned h = rq_hash(g_rq[j].key);
        /* can the entry at j move to i? yes if h is cyclically outside (i, j] */
        if ((j > i && (h <= i || h > j)) || (j < i && (h <= i && h > j))) {
            g_rq[i] = g_rq[j];
            g_rq[j].key = NULL;
            i = j;
        }
    }
}
/* Inserts or replaces; returns NULL when the table is full. Lock held. */
static rq_t *rq_insert(MPI_Request k, uint64_t t) {
    rq_t *e = rq_find(k);
    if (e) {
        /* A handle reused without us seeing its completion: close the old leases. */
        release_locked(e->leases, t);
        if (e->persistent && e->type != MPI_DATATYPE_NULL && !is_named(e->type)) PMPI_Type_free(&e->type);
        memset(e, 0, sizeof *e);
        e->key = k;
        return e;
    }
    if (g_nrq + 1 >= RQ_CAP * 3 / 4) return NULL;
    for (unsigned i = rq_hash(k), n = 0; n < RQ_CAP; i = (i + 1) & (RQ_CAP - 1), n++) {
        if (!g_rq[i].key) {
            memset(&g_rq[i], 0, sizeof g_rq[i]);
            g_rq[i].key = k;
            g_nrq++;
            return &g_rq[i];
        }
    }
    return NULL;
}

/* After a nonblocking call: the request holds the leases until it completes. */
static void track(int rc, const MPI_Request *req, lr_t r) {
    if (r.n == 0) return;
    if (rc != MPI_SUCCESS || !req || *req == MPI_REQUEST_NULL) { release_lr(r); return; }
    int saved = errno;
    uint64_t t = now_ns();
    t_guard = 1;
    lock();
    rq_t *e = rq_insert(*req, t);
    if (e) e->leases = r;
    else { g_req_overflow++; if (atomic_load(&g_recording)) release_locked(r, t); }
    unlock();
    t_guard = 0;
    errno = saved;
}

/* A request completed (or was freed): its leases go. */
static void complete_locked(MPI_Request k, int freed, uint64_t t) {
    rq_t *e = rq_find(k);
    if (!e) return;
    if (atomic_load(&g_recording)) release_locked(e->leases, t);
    e->leases = LR_NONE;
    if (!e->persistent || freed) {
        if (e->persistent && e->type != MPI_DATATYPE_NULL && !is_named(e->type)) PMPI_Type_free(&e->type);
        rq_delete(e);
    }
}
static void complete1(MPI_Request k, int freed) {
    if (k == MPI_REQUEST_NULL || !g_nrq) return;
    int saved = errno;
    uint64_t t = now_ns();
    int g = t_guard;
    t_guard = 1;
    lock();
    complete_locked(k, freed, t);
    unlock();
    t_guard = g;
    errno = saved;
}

/* Persistent requests remember their buffer; MPI_Start acquires it. */
static void persist(int rc, const MPI_Request *req, const void *buf, int count, MPI_Datatype dt, const char *acc,
                    int peer) {
    if (rc != MPI_SUCCESS || !req || *req == MPI_REQUEST_NULL || !active()) return;
    if (peer == MPI_PROC_NULL || count <= 0) return;
    int saved = errno;
    uint64_t t = now_ns();
    t_guard = 1;
    MPI_Datatype mine = dt;
    if (!is_named(dt) && PMPI_Type_dup(dt, &mine) != MPI_SUCCESS) mine = MPI_DATATYPE_NULL;
    lock();
    rq_t *e = rq_insert(*req, t);
    if (e) {
        e->persistent = 1;
        e->buf = buf;
        e->count = count;
        e->type = mine;
        e->acc = acc;
    } else {
        g_req_overflow++;
    }
    unlock();
    if (!e && mine != dt && mine != MPI_DATATYPE_NULL) PMPI_Type_free(&mine);
    t_guard = 0;
    errno = saved;
}

static void start1(MPI_Request k) {
    if (!call_begin()) return;
    rq_t *e = rq_find(k);
    if (e && e->persistent && e->type != MPI_DATATYPE_NULL) {
        release_locked(e->leases, g_call_t);
        uint64_t first = g_next_lease;
        call_buf(e->buf, e->count, e->type, e->acc);
        e->leases.first = first;
        e->leases.n = (uint32_t)(g_next_lease - first);
    }
    call_end();
}

/* Copies request handles before a Wait/Test-family call overwrites them. */
#define KEYS_STACK 256
typedef struct { MPI_Request *k; MPI_Request stack[KEYS_STACK]; int n; } keys_t;
static void keys_save(keys_t *ks, int count, const MPI_Request *reqs) {
    ks->n = 0;
    ks->k = ks->stack;
    if (count <= 0 || !reqs || !g_nrq || !atomic_load(&g_recording)) return;
    if (count > KEYS_STACK) {
        ks->k = __libc_malloc(sizeof(MPI_Request) * (size_t)count);
        if (!ks->k) { ks->k = ks->stack; return; }
    }
    memcpy(ks->k, reqs, sizeof(MPI_Request) * (size_t)count);
    ks->n = count;
}
static void keys_done(keys_t *ks) {
    if (ks->k != ks->stack) __libc_free(ks->k);
}
static void keys_complete(keys_t *ks, int idx) {
    if (idx >= 0 && idx < ks->n) complete1(ks->k[idx], 0);
}

/* ------------------------------------------------------------------------ */
/* RMA windows, MPI_Alloc_mem                                                 */

#define WIN_CAP 64
#define WIN_ATTACH 64
#define WIN_PENDING 256
typedef struct {
    MPI_Win key;
    lr_t mem;
    int nattach;
    struct { uintptr_t base; lr_t l; } att[WIN_ATTACH];
    int npend;
    lr_t pend[WIN_PENDING];
} win_t;
static win_t g_win[WIN_CAP];

static win_t *win_find(MPI_Win w) {
    for (int i = 0; i < WIN_CAP; i++)
        if (g_win[i].key == w) return &g_win[i];
    return NULL;
}
static void win_new(int rc, MPI_Win w, lr_t mem) {
    if (rc != MPI_SUCCESS) { release_lr(mem); return; }
    if (!active()) return;
    int saved = errno;
    t_guard = 1;
    lock();
    win_t *e = NULL;
    for (int i = 0; i < WIN_CAP; i++)
        if (!g_win[i].key) { e = &g_win[i]; break; }
    if (e) {
        memset(e, 0, sizeof *e);
        e->key = w;
        e->mem = mem;
    } else {
        g_win_overflow++;
    }
    unlock();
    t_guard = 0;
    errno = saved;
    if (!e) release_lr(mem);
}
/* An RMA operation's origin buffers stay in use until the window syncs. */
static void win_pending(MPI_Win w, int rc, lr_t r) {
    if (r.n == 0) return;
    if (rc != MPI_SUCCESS) { release_lr(r); return; }
    int saved = errno;
    t_guard = 1;
    lock();
    win_t *e = win_find(w);
    int ok = e && e->npend < WIN_PENDING;
    if (ok) e->pend[e->npend++] = r;
    unlock();
    t_guard = 0;
    errno = saved;
    if (!ok) { g_win_overflow++; release_lr(r); }
}
static void win_sync(MPI_Win w) {
    if (!g_recording) return;
    int saved = errno;
    uint64_t t = now_ns();
    t_guard = 1;
    lock();
    win_t *e = win_find(w);
    if (e) {
        for (int i = 0; i < e->npend; i++) release_locked(e->pend[i], t);
        e->npend = 0;
    }
    unlock();
    t_guard = 0;
    errno = saved;
}

#define AM_CAP 1024
static struct { uintptr_t base; lr_t l; } g_am[AM_CAP];

/* ------------------------------------------------------------------------ */
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

static void open_trace(int rank, int size) {
    char path[1100];
    g_rank = rank;
    g_size = size;
    size_t n = strlen(g_dir);
    memcpy(path, g_dir, n);
    const char *suffix = "/rank-";
    memcpy(path + n, suffix, 6);
    n += 6;
    char num[16];
    int i = 16;
    unsigned r = (unsigned)rank;
    do { num[--i] = (char)('0' + r % 10); r /= 10; } while (r);
    memcpy(path + n, num + i, (size_t)(16 - i));
    n += (size_t)(16 - i);
    memcpy(path + n, ".jsonl", 7);
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
    memcpy(path + n, ".stats.json", 12);
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

#define IN_MPI(call) do { t_depth++; _rc = (call); t_depth--; } while (0)

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

/* Point to point */

#define SEND_LIKE(NAME)                                                                                    \
    MRC_EXPORT int MPI_##NAME(const void *buf, int count, MPI_Datatype dt, int dest, int tag, MPI_Comm comm) { \
        int _rc;                                                                                           \
        lr_t r = dest == MPI_PROC_NULL ? LR_NONE : acq1(buf, count, dt, ACC_SEND);                          \
        IN_MPI(PMPI_##NAME(buf, count, dt, dest, tag, comm));                                              \
        release_lr(r);                                                                                     \
        return _rc;                                                                                        \
    }
SEND_LIKE(Send)
SEND_LIKE(Bsend)
SEND_LIKE(Ssend)
SEND_LIKE(Rsend)

#define ISEND_LIKE(NAME)                                                                                  \
    MRC_EXPORT int MPI_##NAME(const void *buf, int count, MPI_Datatype dt, int dest, int tag, MPI_Comm comm, \
                              MPI_Request *req) {                                                         \
        int _rc;                                                                                          \
        lr_t r = dest == MPI_PROC_NULL ? LR_NONE : acq1(buf, count, dt, ACC_SEND);                         \
        IN_MPI(PMPI_##NAME(buf, count, dt, dest, tag, comm, req));                                        \
        track(_rc, req, r);                                                                               \
        return _rc;                                                                                       \
    }
ISEND_LIKE(Isend)
ISEND_LIKE(Ibsend)
ISEND_LIKE(Issend)
ISEND_LIKE(Irsend)

#define SEND_INIT_LIKE(NAME)                                                                              \
    MRC_EXPORT int MPI_##NAME(const void *buf, int count, MPI_Datatype dt, int dest, int tag, MPI_Comm comm, \
                              MPI_Request *req) {                                                         \
        int _rc;                                                                                          \
        IN_MPI(PMPI_##NAME(buf, count, dt, dest, tag, comm, req));                                        \
        persist(_rc, req, buf, count, dt, ACC_SEND, dest);                                                \
        return _rc;                                                                                       \
    }
SEND_INIT_LIKE(Send_init)
SEND_INIT_LIKE(Bsend_init)
SEND_INIT_LIKE(Ssend_init)
SEND_INIT_LIKE(Rsend_init)

MRC_EXPORT int MPI_Recv(void *buf, int count, MPI_Datatype dt, int src, int tag, MPI_Comm comm, MPI_Status *st) {
    int _rc;
    lr_t r = src == MPI_PROC_NULL ? LR_NONE : acq1(buf, count, dt, ACC_RECV);
    IN_MPI(PMPI_Recv(buf, count, dt, src, tag, comm, st));
    release_lr(r);
    return _rc;
}

MRC_EXPORT int MPI_Irecv(void *buf, int count, MPI_Datatype dt, int src, int tag, MPI_Comm comm, MPI_Request *req) {
    int _rc;
    lr_t r = src == MPI_PROC_NULL ? LR_NONE : acq1(buf, count, dt, ACC_RECV);
    IN_MPI(PMPI_Irecv(buf, count, dt, src, tag, comm, req));
    track(_rc, req, r);
    return _rc;
}

MRC_EXPORT int MPI_Recv_init(void *buf, int count, MPI_Datatype dt, int src, int tag, MPI_Comm comm,
                             MPI_Request *req) {
    int _rc;
    IN_MPI(PMPI_Recv_init(buf, count, dt, src, tag, comm, req));
    persist(_rc, req, buf, count, dt, ACC_RECV, src);
    return _rc;
}

MRC_EXPORT int MPI_Mrecv(void *buf, int count, MPI_Datatype dt, MPI_Message *msg, MPI_Status *st) {
    int _rc;
    lr_t r = acq1(buf, count, dt, ACC_RECV);
    IN_MPI(PMPI_Mrecv(buf, count, dt, msg, st));
    release_lr(r);
    return _rc;
}

MRC_EXPORT int MPI_Imrecv(void *buf, int count, MPI_Datatype dt, MPI_Message *msg, MPI_Request *req) {
    int _rc;
    lr_t r = acq1(buf, count, dt, ACC_RECV);
    IN_MPI(PMPI_Imrecv(buf, count, dt, msg, req));
    track(_rc, req, r);
    return _rc;
}

MRC_EXPORT int MPI_Sendrecv(const void *sbuf, int scount, MPI_Datatype stype, int dest, int stag, void *rbuf,
                            int rcount, MPI_Datatype rtype, int src, int rtag, MPI_Comm comm, MPI_Status *st) {
    int _rc;
    lr_t r = LR_NONE;
    if (call_begin()) {
        if (dest != MPI_PROC_NULL) call_buf(sbuf, scount, stype, ACC_SEND);
        if (src != MPI_PROC_NULL) call_buf(rbuf, rcount, rtype, ACC_RECV);
        r = call_end();
    }
    IN_MPI(PMPI_Sendrecv(sbuf, scount, stype, dest, stag, rbuf, rcount, rtype, src, rtag, comm, st));
    release_lr(r);
    return _rc;
}

MRC_EXPORT int MPI_Sendrecv_replace(void *buf, int count, MPI_Datatype dt, int dest, int stag, int src, int rtag,
                                    MPI_Comm comm, MPI_Status *st) {
    int _rc;
    lr_t r = (dest == MPI_PROC_NULL && src == MPI_PROC_NULL) ? LR_NONE : acq1(buf, count, dt, ACC_BOTH);
    IN_MPI(PMPI_Sendrecv_replace(buf, count, dt, dest, stag, src, rtag, comm, st));
    release_lr(r);
    return _rc;
}

/* Persistent starts, completion */

MRC_EXPORT int MPI_Start(MPI_Request *req) {
    int _rc;
    if (req && g_nrq) start1(*req);
    IN_MPI(PMPI_Start(req));
    return _rc;
}

MRC_EXPORT int MPI_Startall(int count, MPI_Request reqs[]) {
    int _rc;
    if (reqs && g_nrq)
        for (int i = 0; i < count; i++) start1(reqs[i]);
    IN_MPI(PMPI_Startall(count, reqs));
    return _rc;
}

MRC_EXPORT int MPI_Wait(MPI_Request *req, MPI_Status *st) {
    int _rc;
    MPI_Request k = req ? *req : MPI_REQUEST_NULL;
    IN_MPI(PMPI_Wait(req, st));
    complete1(k, 0);
    return _rc;
}

MRC_EXPORT int MPI_Test(MPI_Request *req, int *flag, MPI_Status *st) {
    int _rc;
    MPI_Request k = req ? *req : MPI_REQUEST_NULL;
    IN_MPI(PMPI_Test(req, flag, st));
    if (_rc == MPI_SUCCESS && flag && *flag) complete1(k, 0);
    return _rc;
}

MRC_EXPORT int MPI_Waitall(int count, MPI_Request reqs[], MPI_Status sts[]) {
    int _rc;
    keys_t ks;
    keys_save(&ks, count, reqs);
    IN_MPI(PMPI_Waitall(count, reqs, sts));
    for (int i = 0; i < ks.n; i++) keys_complete(&ks, i);
    keys_done(&ks);
    return _rc;
}

MRC_EXPORT int MPI_Testall(int count, MPI_Request reqs[], int *flag, MPI_Status sts[]) {
    int _rc;
    keys_t ks;
    keys_save(&ks, count, reqs);
    IN_MPI(PMPI_Testall(count, reqs, flag, sts));
    if (_rc == MPI_SUCCESS && flag && *flag)
        for (int i = 0; i < ks.n; i++) keys_complete(&ks, i);
    keys_done(&ks);
    return _rc;
}

MRC_EXPORT int MPI_Waitany(int count, MPI_Request reqs[], int *index, MPI_Status *st) {
    int _rc;
    keys_t ks;
    keys_save(&ks, count, reqs);
    IN_MPI(PMPI_Waitany(count, reqs, index, st));
    if (index && *index != MPI_UNDEFINED) keys_complete(&ks, *index);
    keys_done(&ks);
    return _rc;
}

MRC_EXPORT int MPI_Testany(int count, MPI_Request reqs[], int *index, int *flag, MPI_Status *st) {
    int _rc;
    keys_t ks;
    keys_save(&ks, count, reqs);
    IN_MPI(PMPI_Testany(count, reqs, index, flag, st));
    if (_rc == MPI_SUCCESS && flag && *flag && index && *index != MPI_UNDEFINED) keys_complete(&ks, *index);
    keys_done(&ks);
    return _rc;
}

MRC_EXPORT int MPI_Waitsome(int incount, MPI_Request reqs[], int *outcount, int indices[], MPI_Status sts[]) {
    int _rc;
    keys_t ks;
    keys_save(&ks, incount, reqs);
    IN_MPI(PMPI_Waitsome(incount, reqs, outcount, indices, sts));
    if (outcount && *outcount != MPI_UNDEFINED && indices)
        for (int i = 0; i < *outcount; i++) keys_complete(&ks, indices[i]);
    keys_done(&ks);
    return _rc;
}

MRC_EXPORT int MPI_Testsome(int incount, MPI_Request reqs[], int *outcount, int indices[], MPI_Status sts[]) {
    int _rc;
    keys_t ks;
    keys_save(&ks, incount, reqs);
    IN_MPI(PMPI_Testsome(incount, reqs, outcount, indices, sts));
    if (outcount && *outcount != MPI_UNDEFINED && indices)
        for (int i = 0; i < *outcount; i++) keys_complete(&ks, indices[i]);
    keys_done(&ks);
    return _rc;
}

/* A freed active request keeps running in the background; the recorder
 * releases its buffers at the free (the latest point it can see). */
MRC_EXPORT int MPI_Request_free(MPI_Request *req) {
    int _rc;
    MPI_Request k = req ? *req : MPI_REQUEST_NULL;
    IN_MPI(PMPI_Request_free(req));
    complete1(k, 1);
    return _rc;
}

/* Collectives */

static void comm_info(MPI_Comm comm, int *size, int *rank, int *inter) {
    *size = 0;
    *rank = -1;
    *inter = 0;
    if (comm == MPI_COMM_NULL) return;
    PMPI_Comm_test_inter(comm, inter);
    if (*inter) {
        PMPI_Comm_remote_size(comm, size);
    } else {
        PMPI_Comm_size(comm, size);
        PMPI_Comm_rank(comm, rank);
    }
}
static MPI_Aint extent_of(MPI_Datatype dt) {
    MPI_Aint lb = 0, ext = 0;
    if (dt != MPI_DATATYPE_NULL) PMPI_Type_get_extent(dt, &lb, &ext);
    return ext;
}
/* Per-peer segments of a v-variant buffer (displacements in extents); the
 * segment for the caller itself is a local copy, never registered. */
static void call_peers_v(const void *buf, const int counts[], const int displs[], MPI_Datatype dt, const char *acc,
                         int size, int self) {
    if (!g_in_call || !buf || buf == MPI_IN_PLACE || !counts || !displs) return;
    MPI_Aint ext = extent_of(dt);
    for (int j = 0; j < size; j++)
        if (j != self && counts[j] > 0) call_buf((const char *)buf + (MPI_Aint)displs[j] * ext, counts[j], dt, acc);
}
/* w-variants: displacements in bytes, one type per peer. */
static void call_peers_w(const void *buf, const int counts[], const int displs[], const MPI_Datatype types[],
                         const char *acc, int size, int self) {
    if (!g_in_call || !buf || buf == MPI_IN_PLACE || !counts || !displs || !types) return;
    for (int j = 0; j < size; j++)
        if (j != self && counts[j] > 0) call_buf((const char *)buf + displs[j], counts[j], types[j], acc);
}
static int is_root(MPI_Comm comm, int root) {
    int size, rank, inter;
    comm_info(comm, &size, &rank, &inter);
    return inter ? root == MPI_ROOT : rank == root;
}
static int is_nonroot(MPI_Comm comm, int root) {
    int size, rank, inter;
    comm_info(comm, &size, &rank, &inter);
    return inter ? root >= 0 : rank != root;
}

#define BLOCKING(call, body)          \
    do {                              \
        lr_t r = LR_NONE;             \
        if (call_begin()) {           \
            body;                     \
            r = call_end();           \
        }                             \
        IN_MPI(call);                 \
        release_lr(r);                \
    } while (0)
#define NONBLOCKING(call, req, body)  \
    do {                              \
        lr_t r = LR_NONE;             \
        if (call_begin()) {           \
            body;                     \
            r = call_end();           \
        }                             \
        IN_MPI(call);                 \
        track(_rc, req, r);           \
    } while (0)

/* Bcast */
#define BCAST_BODY                                                                  \
    if (is_root(comm, root)) call_buf(buf, count, dt, ACC_SEND);                    \
    else if (is_nonroot(comm, root)) call_buf(buf, count, dt, ACC_RECV)
MRC_EXPORT int MPI_Bcast(void *buf, int count, MPI_Datatype dt, int root, MPI_Comm comm) {
    int _rc;
    BLOCKING(PMPI_Bcast(buf, count, dt, root, comm), BCAST_BODY);
    return _rc;
}
MRC_EXPORT int MPI_Ibcast(void *buf, int count, MPI_Datatype dt, int root, MPI_Comm comm, MPI_Request *req) {
    int _rc;
    NONBLOCKING(PMPI_Ibcast(buf, count, dt, root, comm, req), req, BCAST_BODY);
    return _rc;
}

/* Reduce */
#define REDUCE_BODY                                                                            \
    if (is_root(comm, root)) {                                                                 \
        call_buf(sbuf, count, dt, ACC_SEND);                                                   \
        call_buf(rbuf, count, dt, sbuf == MPI_IN_PLACE ? ACC_BOTH : ACC_RECV);                  \
    } else if (is_nonroot(comm, root)) {                                                       \
        call_buf(sbuf, count, dt, ACC_SEND);                                                   \
    }
MRC_EXPORT int MPI_Reduce(const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op, int root,
                          MPI_Comm comm) {
    int _rc;
    BLOCKING(PMPI_Reduce(sbuf, rbuf, count, dt, op, root, comm), REDUCE_BODY);
    return _rc;
}
MRC_EXPORT int MPI_Ireduce(const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op, int root,
                           MPI_Comm comm, MPI_Request *req) {
    int _rc;
    NONBLOCKING(PMPI_Ireduce(sbuf, rbuf, count, dt, op, root, comm, req), req, REDUCE_BODY);
    return _rc;
}

/* Allreduce, Scan, Exscan */
#define ALLRED_BODY                                                      \
    call_buf(sbuf, count, dt, ACC_SEND);                                 \
    call_buf(rbuf, count, dt, sbuf == MPI_IN_PLACE ? ACC_BOTH : ACC_RECV)
#define ALLRED_LIKE(NAME, INAME)                                                                               \
    MRC_EXPORT int MPI_##NAME(const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op,         \
                              MPI_Comm comm) {                                                            \
        int _rc;                                                                                          \
        BLOCKING(PMPI_##NAME(sbuf, rbuf, count, dt, op, comm), ALLRED_BODY);                              \
        return _rc;                                                                                       \
    }                                                                                                     \
    MRC_EXPORT int MPI_##INAME(const void *sbuf, void *rbuf, int count, MPI_Datatype dt, MPI_Op op,       \
                               MPI_Comm comm, MPI_Request *req) {                                         \
        int _rc;                                                                                          \
        NONBLOCKING(PMPI_##INAME(sbuf, rbuf, count, dt, op, comm, req), req, ALLRED_BODY);                \
        return _rc;                                                                                       \
    }
ALLRED_LIKE(Allreduce, Iallreduce)
ALLRED_LIKE(Scan, Iscan)
ALLRED_LIKE(Exscan, Iexscan)

/* Reduce_scatter_block: sbuf holds size*rcount elements */
#define RSB_BODY                                                             \
    int size, rank, inter;                                                   \
    comm_info(comm, &size, &rank, &inter);                                   \
    call_buf(sbuf, (MPI_Aint)rcount * size, dt, ACC_SEND);                   \
    call_buf(rbuf, rcount, dt, sbuf == MPI_IN_PLACE ? ACC_BOTH : ACC_RECV)
MRC_EXPORT int MPI_Reduce_scatter_block(const void *sbuf, void *rbuf, int rcount, MPI_Datatype dt, MPI_Op op,
                                        MPI_Comm comm) {
    int _rc;
    BLOCKING(PMPI_Reduce_scatter_block(sbuf, rbuf, rcount, dt, op, comm), RSB_BODY);
    return _rc;
}
MRC_EXPORT int MPI_Ireduce_scatter_block(const void *sbuf, void *rbuf, int rcount, MPI_Datatype dt, MPI_Op op,
                                         MPI_Comm comm, MPI_Request *req) {
    int _rc;
    NONBLOCKING(PMPI_Ireduce_scatter_block(sbuf, rbuf, rcount, dt, op, comm, req), req, RSB_BODY);
    return _rc;
}

/* Reduce_scatter: sbuf holds sum(rcounts) elements */
#define RS_BODY                                                                         \
    int size, rank, inter;                                                              \
    comm_info(comm, &size, &rank, &inter);                                              \
    MPI_Aint total = 0;                                                                 \
    for (int j = 0; j < size && rcounts; j++) total += rcounts[j];                      \
    call_buf(sbuf, total, dt, ACC_SEND);                                                \
    if (rank >= 0 && rcounts)                                                           \
        call_buf(rbuf, rcounts[rank], dt, sbuf == MPI_IN_PLACE ? ACC_BOTH : ACC_RECV)
MRC_EXPORT int MPI_Reduce_scatter(const void *sbuf, void *rbuf, const int rcounts[], MPI_Datatype dt, MPI_Op op,
                                  MPI_Comm comm) {
    int _rc;
    BLOCKING(PMPI_Reduce_scatter(sbuf, rbuf, rcounts, dt, op, comm), RS_BODY);
    return _rc;
}
MRC_EXPORT int MPI_Ireduce_scatter(const void *sbuf, void *rbuf, const int rcounts[], MPI_Datatype dt, MPI_Op op,
                                   MPI_Comm comm, MPI_Request *req) {
    int _rc;
    NONBLOCKING(PMPI_Ireduce_scatter(sbuf, rbuf, rcounts, dt, op, comm, req), req, RS_BODY);
    return _rc;
}

/* Gather / Gatherv */
#define GATHER_BODY                                                                              \
    int size, rank, inter;                                                                       \
    comm_info(comm, &size, &rank, &inter);                                                       \
    int root_ = is_root(comm, root);                                                             \
    if (!(inter && root_)) call_buf(sbuf, scount, stype, ACC_SEND);                              \
    if (root_) call_buf(rbuf, (MPI_Aint)rcount * size, rtype, sbuf == MPI_IN_PLACE ? ACC_BOTH : ACC_RECV)
MRC_EXPORT int MPI_Gather(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount,
                          MPI_Datatype rtype, int root, MPI_Comm comm) {
    int _rc;
    BLOCKING(PMPI_Gather(sbuf, scount, stype, rbuf, rcount, rtype, root, comm), GATHER_BODY);
    return _rc;
}
MRC_EXPORT int MPI_Igather(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount,
                           MPI_Datatype rtype, int root, MPI_Comm comm, MPI_Request *req) {
    int _rc;
    NONBLOCKING(PMPI_Igather(sbuf, scount, stype, rbuf, rcount, rtype, root, comm, req), req, GATHER_BODY);
    return _rc;
}
#define GATHERV_BODY                                                                             \
    int size, rank, inter;                                                                       \
    comm_info(comm, &size, &rank, &inter);                                                       \
    int root_ = is_root(comm, root);                                                             \
    if (!(inter && root_)) call_buf(sbuf, scount, stype, ACC_SEND);                              \
    if (root_) call_peers_v(rbuf, rcounts, displs, rtype, ACC_RECV, size, rank)
MRC_EXPORT int MPI_Gatherv(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, const int rcounts[],
                           const int displs[], MPI_Datatype rtype, int root, MPI_Comm comm) {
    int _rc;
    BLOCKING(PMPI_Gatherv(sbuf, scount, stype, rbuf, rcounts, displs, rtype, root, comm), GATHERV_BODY);
    return _rc;
}
MRC_EXPORT int MPI_Igatherv(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, const int rcounts[],
                            const int displs[], MPI_Datatype rtype, int root, MPI_Comm comm, MPI_Request *req) {
    int _rc;
    NONBLOCKING(PMPI_Igatherv(sbuf, scount, stype, rbuf, rcounts, displs, rtype, root, comm, req), req,
                GATHERV_BODY);
    return _rc;
}

/* Scatter / Scatterv */
#define SCATTER_BODY                                                                             \
    int size, rank, inter;                                                                       \
    comm_info(comm, &size, &rank, &inter);                                                       \
    int root_ = is_root(comm, root);                                                             \
    if (root_) call_buf(sbuf, (MPI_Aint)scount * size, stype, ACC_SEND);                         \
    if (!(inter && root_)) call_buf(rbuf, rcount, rtype, ACC_RECV)
MRC_EXPORT int MPI_Scatter(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount,
                           MPI_Datatype rtype, int root, MPI_Comm comm) {
    int _rc;
    BLOCKING(PMPI_Scatter(sbuf, scount, stype, rbuf, rcount, rtype, root, comm), SCATTER_BODY);
    return _rc;
}
MRC_EXPORT int MPI_Iscatter(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount,
                            MPI_Datatype rtype, int root, MPI_Comm comm, MPI_Request *req) {
    int _rc;
    NONBLOCKING(PMPI_Iscatter(sbuf, scount, stype, rbuf, rcount, rtype, root, comm, req), req, SCATTER_BODY);
    return _rc;
}
#define SCATTERV_BODY                                                                            \
    int size, rank, inter;                                                                       \
    comm_info(comm, &size, &rank, &inter);                                                       \
    int root_ = is_root(comm, root);                                                             \
    if (root_) call_peers_v(sbuf, scounts, displs, stype, ACC_SEND, size, rank);                 \
    if (!(inter && root_)) call_buf(rbuf, rcount, rtype, ACC_RECV)
MRC_EXPORT int MPI_Scatterv(const void *sbuf, const int scounts[], const int displs[], MPI_Datatype stype,
                            void *rbuf, int rcount, MPI_Datatype rtype, int root, MPI_Comm comm) {
    int _rc;
    BLOCKING(PMPI_Scatterv(sbuf, scounts, displs, stype, rbuf, rcount, rtype, root, comm), SCATTERV_BODY);
    return _rc;
}
MRC_EXPORT int MPI_Iscatterv(const void *sbuf, const int scounts[], const int displs[], MPI_Datatype stype,
                             void *rbuf, int rcount, MPI_Datatype rtype, int root, MPI_Comm comm,
                             MPI_Request *req) {
    int _rc;
    NONBLOCKING(PMPI_Iscatterv(sbuf, scounts, displs, stype, rbuf, rcount, rtype, root, comm, req), req,
                SCATTERV_BODY);
    return _rc;
}

/* Allgather / Allgatherv */
#define ALLGATHER_BODY                                                                           \
    int size, rank, inter;                                                                       \
    comm_info(comm, &size, &rank, &inter);                                                       \
    call_buf(sbuf, scount, stype, ACC_SEND);                                                     \
    call_buf(rbuf, (MPI_Aint)rcount * size, rtype, sbuf == MPI_IN_PLACE ? ACC_BOTH : ACC_RECV)
MRC_EXPORT int MPI_Allgather(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount,
                             MPI_Datatype rtype, MPI_Comm comm) {
    int _rc;
    BLOCKING(PMPI_Allgather(sbuf, scount, stype, rbuf, rcount, rtype, comm), ALLGATHER_BODY);
    return _rc;
}
MRC_EXPORT int MPI_Iallgather(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount,
                              MPI_Datatype rtype, MPI_Comm comm, MPI_Request *req) {
    int _rc;
    NONBLOCKING(PMPI_Iallgather(sbuf, scount, stype, rbuf, rcount, rtype, comm, req), req, ALLGATHER_BODY);
    return _rc;
}
#define ALLGATHERV_BODY                                                                          \
    int size, rank, inter;                                                                       \
    comm_info(comm, &size, &rank, &inter);                                                       \
    call_buf(sbuf, scount, stype, ACC_SEND);                                                     \
    call_peers_v(rbuf, rcounts, displs, rtype, ACC_RECV, size, rank)
MRC_EXPORT int MPI_Allgatherv(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, const int rcounts[],
                              const int displs[], MPI_Datatype rtype, MPI_Comm comm) {
    int _rc;
    BLOCKING(PMPI_Allgatherv(sbuf, scount, stype, rbuf, rcounts, displs, rtype, comm), ALLGATHERV_BODY);
    return _rc;
}
MRC_EXPORT int MPI_Iallgatherv(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, const int rcounts[],
                               const int displs[], MPI_Datatype rtype, MPI_Comm comm, MPI_Request *req) {
    int _rc;
    NONBLOCKING(PMPI_Iallgatherv(sbuf, scount, stype, rbuf, rcounts, displs, rtype, comm, req), req,
                ALLGATHERV_BODY);
    return _rc;
}

/* Alltoall / Alltoallv / Alltoallw */
#define ALLTOALL_BODY                                                                            \
    int size, rank, inter;                                                                       \
    comm_info(comm, &size, &rank, &inter);                                                       \
    call_buf(sbuf, (MPI_Aint)scount * size, stype, ACC_SEND);                                    \
    call_buf(rbuf, (MPI_Aint)rcount * size, rtype, sbuf == MPI_IN_PLACE ? ACC_BOTH : ACC_RECV)
MRC_EXPORT int MPI_Alltoall(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount,
                            MPI_Datatype rtype, MPI_Comm comm) {
    int _rc;
    BLOCKING(PMPI_Alltoall(sbuf, scount, stype, rbuf, rcount, rtype, comm), ALLTOALL_BODY);
    return _rc;
}
MRC_EXPORT int MPI_Ialltoall(const void *sbuf, int scount, MPI_Datatype stype, void *rbuf, int rcount,
                             MPI_Datatype rtype, MPI_Comm comm, MPI_Request *req) {
    int _rc;
    NONBLOCKING(PMPI_Ialltoall(sbuf, scount, stype, rbuf, rcount, rtype, comm, req), req, ALLTOALL_BODY);
    return _rc;
}
#define ALLTOALLV_BODY                                                                           \
    int size, rank, inter;                                                                       \
    comm_info(comm, &size, &rank, &inter);                                                       \
    call_peers_v(sbuf, scounts, sdispls, stype, ACC_SEND, size, rank);                           \
    call_peers_v(rbuf, rcounts, rdispls, rtype, sbuf == MPI_IN_PLACE ? ACC_BOTH : ACC_RECV, size, rank)
MRC_EXPORT int MPI_Alltoallv(const void *sbuf, const int scounts[], const int sdispls[], MPI_Datatype stype,
                             void *rbuf, const int rcounts[], const int rdispls[], MPI_Datatype rtype,
                             MPI_Comm comm) {
    int _rc;
    BLOCKING(PMPI_Alltoallv(sbuf, scounts, sdispls, stype, rbuf, rcounts, rdispls, rtype, comm), ALLTOALLV_BODY);
    return _rc;
}
MRC_EXPORT int MPI_Ialltoallv(const void *sbuf, const int scounts[], const int sdispls[], MPI_Datatype stype,
                              void *rbuf, const int rcounts[], const int rdispls[], MPI_Datatype rtype,
                              MPI_Comm comm, MPI_Request *req) {
    int _rc;
    NONBLOCKING(PMPI_Ialltoallv(sbuf, scounts, sdispls, stype, rbuf, rcounts, rdispls, rtype, comm, req), req,
                ALLTOALLV_BODY);
    return _rc;
}
#define ALLTOALLW_BODY                                                                           \
    int size, rank, inter;                                                                       \
    comm_info(comm, &size, &rank, &inter);                                                       \
    call_peers_w(sbuf, scounts, sdispls, stypes, ACC_SEND, size, rank);                          \
    call_peers_w(rbuf, rcounts, rdispls, rtypes, sbuf == MPI_IN_PLACE ? ACC_BOTH : ACC_RECV, size, rank)
MRC_EXPORT int MPI_Alltoallw(const void *sbuf, const int scounts[], const int sdispls[], const MPI_Datatype stypes[],
                             void *rbuf, const int rcounts[], const int rdispls[], const MPI_Datatype rtypes[],
                             MPI_Comm comm) {
    int _rc;
    BLOCKING(PMPI_Alltoallw(sbuf, scounts, sdispls, stypes, rbuf, rcounts, rdispls, rtypes, comm),
             ALLTOALLW_BODY);
    return _rc;
}
MRC_EXPORT int MPI_Ialltoallw(const void *sbuf, const int scounts[], const int sdispls[],
                              const MPI_Datatype stypes[], void *rbuf, const int rcounts[], const int rdispls[],
                              const MPI_Datatype rtypes[], MPI_Comm comm, MPI_Request *req) {
    int _rc;
    NONBLOCKING(PMPI_Ialltoallw(sbuf, scounts, sdispls, stypes, rbuf, rcounts, rdispls, rtypes, comm, req), req,
                ALLTOALLW_BODY);
    return _rc;
}

/* RMA */

MRC_EXPORT int MPI_Win_create(void *base, MPI_Aint size, int disp_unit, MPI_Info info, MPI_Comm comm, MPI_Win *win) {
    int _rc;
    lr_t r = LR_NONE;
    if (call_begin()) {
        call_span(base, (size_t)size, ACC_WIN);
        r = call_end();
    }
    IN_MPI(PMPI_Win_create(base, size, disp_unit, info, comm, win));
    win_new(_rc, _rc == MPI_SUCCESS ? *win : MPI_WIN_NULL, r);
    return _rc;
}

MRC_EXPORT int MPI_Win_allocate(MPI_Aint size, int disp_unit, MPI_Info info, MPI_Comm comm, void *baseptr,
                                MPI_Win *win) {
    int _rc;
    IN_MPI(PMPI_Win_allocate(size, disp_unit, info, comm, baseptr, win));
    lr_t r = LR_NONE;
    if (_rc == MPI_SUCCESS && call_begin()) {
        call_span(*(void **)baseptr, (size_t)size, ACC_WIN);
        r = call_end();
    }
    win_new(_rc, _rc == MPI_SUCCESS ? *win : MPI_WIN_NULL, r);
    return _rc;
}

MRC_EXPORT int MPI_Win_allocate_shared(MPI_Aint size, int disp_unit, MPI_Info info, MPI_Comm comm, void *baseptr,
                                       MPI_Win *win) {
    int _rc;
    IN_MPI(PMPI_Win_allocate_shared(size, disp_unit, info, comm, baseptr, win));
    lr_t r = LR_NONE;
    if (_rc == MPI_SUCCESS && call_begin()) {
        call_span(*(void **)baseptr, (size_t)size, ACC_WIN);
        r = call_end();
    }
    win_new(_rc, _rc == MPI_SUCCESS ? *win : MPI_WIN_NULL, r);
    return _rc;
}

MRC_EXPORT int MPI_Win_create_dynamic(MPI_Info info, MPI_Comm comm, MPI_Win *win) {
    int _rc;
    IN_MPI(PMPI_Win_create_dynamic(info, comm, win));
    win_new(_rc, _rc == MPI_SUCCESS ? *win : MPI_WIN_NULL, LR_NONE);
    return _rc;
}

MRC_EXPORT int MPI_Win_attach(MPI_Win win, void *base, MPI_Aint size) {
    int _rc;
    lr_t r = LR_NONE;
    if (call_begin()) {
        call_span(base, (size_t)size, ACC_WIN);
        r = call_end();
    }
    IN_MPI(PMPI_Win_attach(win, base, size));
    if (_rc != MPI_SUCCESS || r.n == 0) { release_lr(r); return _rc; }
    int ok = 0;
    t_guard = 1;
    lock();
    win_t *e = win_find(win);
    if (e && e->nattach < WIN_ATTACH) {
        e->att[e->nattach].base = (uintptr_t)base;
        e->att[e->nattach].l = r;
        e->nattach++;
        ok = 1;
    }
    unlock();
    t_guard = 0;
    if (!ok) { g_win_overflow++; release_lr(r); }
    return _rc;
}

MRC_EXPORT int MPI_Win_detach(MPI_Win win, const void *base) {
    int _rc;
    IN_MPI(PMPI_Win_detach(win, base));
    if (_rc == MPI_SUCCESS && g_recording) {
        lr_t r = LR_NONE;
        t_guard = 1;
        lock();
        win_t *e = win_find(win);
        for (int i = 0; e && i < e->nattach; i++)
            if (e->att[i].base == (uintptr_t)base) {
                r = e->att[i].l;
                e->att[i] = e->att[--e->nattach];
                break;
            }
        unlock();
        t_guard = 0;
        release_lr(r);
    }
    return _rc;
}

MRC_EXPORT int MPI_Win_free(MPI_Win *win) {
    int _rc;
    MPI_Win w = win ? *win : MPI_WIN_NULL;
    IN_MPI(PMPI_Win_free(win));
    if (_rc == MPI_SUCCESS && g_recording) {
        uint64_t t = now_ns();
        t_guard = 1;
        lock();
        win_t *e = win_find(w);
        if (e && atomic_load(&g_recording)) {
            for (int i = 0; i < e->npend; i++) release_locked(e->pend[i], t);
            for (int i = 0; i < e->nattach; i++) release_locked(e->att[i].l, t);
            release_locked(e->mem, t);
            memset(e, 0, sizeof *e);
        }
        unlock();
        t_guard = 0;
    }
    return _rc;
}

#define RMA_ORIGIN(NAME, PARAMS, ARGS, BODY)            \
    MRC_EXPORT int MPI_##NAME PARAMS {                  \
        int _rc;                                        \
        lr_t r = LR_NONE;                               \
        if (call_begin()) {                             \
            BODY;                                       \
            r = call_end();                             \
        }                                               \
        IN_MPI(PMPI_##NAME ARGS);                       \
        win_pending(win, _rc, r);                       \
        return _rc;                                     \
    }
RMA_ORIGIN(Put,
           (const void *obuf, int ocount, MPI_Datatype otype, int trank, MPI_Aint tdisp, int tcount,
            MPI_Datatype ttype, MPI_Win win),
           (obuf, ocount, otype, trank, tdisp, tcount, ttype, win), call_buf(obuf, ocount, otype, ACC_ORIGIN))
RMA_ORIGIN(Get,
           (void *obuf, int ocount, MPI_Datatype otype, int trank, MPI_Aint tdisp, int tcount, MPI_Datatype ttype,
            MPI_Win win),
           (obuf, ocount, otype, trank, tdisp, tcount, ttype, win), call_buf(obuf, ocount, otype, ACC_RESULT))
RMA_ORIGIN(Accumulate,
           (const void *obuf, int ocount, MPI_Datatype otype, int trank, MPI_Aint tdisp, int tcount,
            MPI_Datatype ttype, MPI_Op op, MPI_Win win),
           (obuf, ocount, otype, trank, tdisp, tcount, ttype, op, win), call_buf(obuf, ocount, otype, ACC_ORIGIN))
RMA_ORIGIN(Get_accumulate,
           (const void *obuf, int ocount, MPI_Datatype otype, void *rbuf, int rcount, MPI_Datatype rtype, int trank,
            MPI_Aint tdisp, int tcount, MPI_Datatype ttype, MPI_Op op, MPI_Win win),
           (obuf, ocount, otype, rbuf, rcount, rtype, trank, tdisp, tcount, ttype, op, win),
           call_buf(obuf, ocount, otype, ACC_ORIGIN);
           call_buf(rbuf, rcount, rtype, ACC_RESULT))
RMA_ORIGIN(Fetch_and_op,
           (const void *obuf, void *rbuf, MPI_Datatype dt, int trank, MPI_Aint tdisp, MPI_Op op, MPI_Win win),
           (obuf, rbuf, dt, trank, tdisp, op, win),
           call_buf(obuf, 1, dt, ACC_ORIGIN);
           call_buf(rbuf, 1, dt, ACC_RESULT))
RMA_ORIGIN(Compare_and_swap,
           (const void *obuf, const void *cbuf, void *rbuf, MPI_Datatype dt, int trank, MPI_Aint tdisp, MPI_Win win),
           (obuf, cbuf, rbuf, dt, trank, tdisp, win),
           call_buf(obuf, 1, dt, ACC_ORIGIN);
           call_buf(cbuf, 1, dt, ACC_ORIGIN);
           call_buf(rbuf, 1, dt, ACC_RESULT))

/* Request-based RMA: complete at Wait/Test. */
MRC_EXPORT int MPI_Rput(const void *obuf, int ocount, MPI_Datatype otype, int trank, MPI_Aint tdisp, int tcount,
                        MPI_Datatype ttype, MPI_Win win, MPI_Request *req) {
    int _rc;
    NONBLOCKING(PMPI_Rput(obuf, ocount, otype, trank, tdisp, tcount, ttype, win, req), req,
                call_buf(obuf, ocount, otype, ACC_ORIGIN));
    return _rc;
}
MRC_EXPORT int MPI_Rget(void *obuf, int ocount, MPI_Datatype otype, int trank, MPI_Aint tdisp, int tcount,
                        MPI_Datatype ttype, MPI_Win win, MPI_Request *req) {
    int _rc;
    NONBLOCKING(PMPI_Rget(obuf, ocount, otype, trank, tdisp, tcount, ttype, win, req), req,
                call_buf(obuf, ocount, otype, ACC_RESULT));
    return _rc;
}
MRC_EXPORT int MPI_Raccumulate(const void *obuf, int ocount, MPI_Datatype otype, int trank, MPI_Aint tdisp,
                               int tcount, MPI_Datatype ttype, MPI_Op op, MPI_Win win, MPI_Request *req) {
    int _rc;
    NONBLOCKING(PMPI_Raccumulate(obuf, ocount, otype, trank, tdisp, tcount, ttype, op, win, req), req,
                call_buf(obuf, ocount, otype, ACC_ORIGIN));
    return _rc;
}
MRC_EXPORT int MPI_Rget_accumulate(const void *obuf, int ocount, MPI_Datatype otype, void *rbuf, int rcount,
                                   MPI_Datatype rtype, int trank, MPI_Aint tdisp, int tcount, MPI_Datatype ttype,
                                   MPI_Op op, MPI_Win win, MPI_Request *req) {
    int _rc;
    NONBLOCKING(PMPI_Rget_accumulate(obuf, ocount, otype, rbuf, rcount, rtype, trank, tdisp, tcount, ttype, op, win,
                                     req),
                req, call_buf(obuf, ocount, otype, ACC_ORIGIN); call_buf(rbuf, rcount, rtype, ACC_RESULT));
    return _rc;
}

/* Synchronisation completes the pending origin buffers. */
#define WIN_SYNC(NAME, PARAMS, ARGS)              \
    MRC_EXPORT int MPI_##NAME PARAMS {            \
        int _rc;                                  \
        IN_MPI(PMPI_##NAME ARGS);                 \
        if (_rc == MPI_SUCCESS) win_sync(win);    \
        return _rc;                               \
    }
WIN_SYNC(Win_fence, (int assert, MPI_Win win), (assert, win))
WIN_SYNC(Win_complete, (MPI_Win win), (win))
WIN_SYNC(Win_unlock, (int rank, MPI_Win win), (rank, win))
WIN_SYNC(Win_unlock_all, (MPI_Win win), (win))
WIN_SYNC(Win_flush, (int rank, MPI_Win win), (rank, win))
WIN_SYNC(Win_flush_all, (MPI_Win win), (win))
WIN_SYNC(Win_flush_local, (int rank, MPI_Win win), (rank, win))
WIN_SYNC(Win_flush_local_all, (MPI_Win win), (win))

/* MPI_Alloc_mem: memory meant for RMA, registered by many transports. */
MRC_EXPORT int MPI_Alloc_mem(MPI_Aint size, MPI_Info info, void *baseptr) {
    int _rc;
    IN_MPI(PMPI_Alloc_mem(size, info, baseptr));
    if (_rc != MPI_SUCCESS || size <= 0 || !call_begin()) return _rc;
    void *base = *(void **)baseptr;
    call_span(base, (size_t)size, ACC_WIN);
    int stored = 0;
    for (int i = 0; i < AM_CAP; i++)
        if (!g_am[i].base) {
            g_am[i].base = (uintptr_t)base;
            g_am[i].l.first = g_call_first;
            g_am[i].l.n = (uint32_t)(g_next_lease - g_call_first);
            stored = 1;
            break;
        }
    lr_t r = call_end();
    if (!stored) { g_win_overflow++; release_lr(r); }
    return _rc;
}

MRC_EXPORT int MPI_Free_mem(void *base) {
    int _rc;
    lr_t r = LR_NONE;
    if (base && g_recording) {
        t_guard = 1;
        lock();
        for (int i = 0; i < AM_CAP; i++)
            if (g_am[i].base == (uintptr_t)base) { r = g_am[i].l; g_am[i].base = 0; break; }
        unlock();
        t_guard = 0;
    }
    release_lr(r); /* before the memory goes: the free follows */
    IN_MPI(PMPI_Free_mem(base));
    return _rc;
}
