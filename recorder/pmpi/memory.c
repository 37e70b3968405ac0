/*
 * libmrcache_pmpi: memory hooks.
 *
 * The malloc family, the mmap family, brk/sbrk and shmat/shmdt: `alloc`,
 * `free` and `release_event` records.
 * Part of recorder/pmpi_shim.c, which includes it (one translation unit:
 * the recorder's state is static).
 */

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
