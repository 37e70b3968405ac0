// The callback trampolines: the only frames between the library's Rust code
// and a caller's `reg`/`dereg`. Each stops whatever leaves the callback
// other than by its return, so that no unwind and no jump ever crosses a
// Rust frame (spec.md S7.8):
//
//  - a C++ exception is caught here and destroyed; the callback counts as
//    failed (ESCAPE_THREW, with its what()).
//  - a forced unwind (pthread_exit, or a cancel the callback enabled itself)
//    unwinds the callback's own frames, running their cleanups, and then
//    lands here: a glibc cancellation buffer (`__pthread_register_cancel`,
//    the ABI that C's pthread_cleanup_push compiles to) is registered
//    around the call, so glibc's unwinder longjmps to it once the next frame
//    is this one's. The callback counts as failed (ESCAPE_EXIT); the Rust
//    side finishes the library call and resumes the thread's exit at the
//    entry point (`mrcache_escape_resume_exit`, where no library frame is
//    left but the entry's own, which has nothing to clean up).
//  - a longjmp over this frame runs the old-style cleanup handler pushed
//    here (glibc's longjmp runs those of the frames it skips, before it
//    jumps): it unregisters the cancellation buffer (which would otherwise
//    dangle) and reports the escape to the library (ESCAPE_LONGJMP), which
//    abandons the thread's in-flight call. The header forbids it all the
//    same: the library's frames above are skipped.
//
// Where the forced unwind lands: glibc's unwinder calls its stop function
// before each frame's personality, with the CFA of the frame below, and
// jumps to the buffer once that CFA is not below the buffer's saved stack
// pointer. So the buffer is saved in `land`, which calls the callback and
// has no handler, and the catch clauses are in `trampoline` above it: the
// jump comes before the trampoline's personality would see the unwind, and
// after the callback's own cleanups ran.

#include <cxxabi.h>
#include <exception>
#include <pthread.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

extern "C" {

// glibc's cancellation-buffer ABI (public since 2.3.3; what C's
// pthread_cleanup_push expands to without -fexceptions). pthread.h declares
// them only for C without exceptions, so they are declared here.
void __pthread_register_cancel(__pthread_unwind_buf_t *buf);
void __pthread_unregister_cancel(__pthread_unwind_buf_t *buf);
void __pthread_unwind_next(__pthread_unwind_buf_t *buf) __attribute__((__noreturn__));
// The old-style cleanup handlers, which glibc's longjmp runs for the frames
// it skips.
void _pthread_cleanup_push(struct _pthread_cleanup_buffer *buf, void (*routine)(void *), void *arg);
void _pthread_cleanup_pop(struct _pthread_cleanup_buffer *buf, int execute);

typedef int (*mrcache_escape_reg_fn)(void *, void *, size_t, uint32_t, void **, uint32_t *, uint32_t *);
typedef int (*mrcache_escape_dereg_fn)(void *, void *);

// How a callback ended. Kept in step with `Escape` in src/escape.rs.
enum {
    ESCAPE_RETURNED = 0,
    ESCAPE_THREW = 1,
    ESCAPE_EXIT = 2,
    ESCAPE_LONGJMP = 3,
};

struct mrcache_escape {
    int kind;
    // Called (on longjmp only) with `on_longjmp_arg`, before the jump, while
    // every frame is still there.
    void (*on_longjmp)(void *);
    void *on_longjmp_arg;
};

struct mrcache_escape_reg_call {
    mrcache_escape_reg_fn reg;
    void *ctx;
    void *addr;
    size_t len;
    uint32_t access;
    void **handle;
    uint32_t *lkey;
    uint32_t *rkey;
};

}  // extern "C"

namespace {

struct Landing {
    __pthread_unwind_buf_t exit;
    struct _pthread_cleanup_buffer jump;
    mrcache_escape *escape;
};

void on_longjmp(void *arg) {
    Landing *landing = static_cast<Landing *>(arg);
    // The jump skips this frame: glibc must not land a later pthread_exit in it.
    __pthread_unregister_cancel(&landing->exit);
    landing->escape->kind = ESCAPE_LONGJMP;
    if (landing->escape->on_longjmp) landing->escape->on_longjmp(landing->escape->on_longjmp_arg);
}

// The last exception's what() on this thread (mrcache_escape_what), kept
// out of `mrcache_escape` so that a call that returns copies nothing.
thread_local char last_what[192];

void describe(mrcache_escape *escape, const char *what) {
    escape->kind = ESCAPE_THREW;
    strncpy(last_what, what, sizeof last_what - 1);
    last_what[sizeof last_what - 1] = '\0';
}

// Calls the callback with the landing buffers registered. No handler of
// its own: glibc's unwinder jumps to the buffer when it is about to run the
// personality of the frame above this one (the trampoline's), whose catch
// clauses would otherwise take the forced unwind. Never inlined: the buffer
// must be saved in a frame below the trampoline's.
template <class Call>
__attribute__((noinline)) int land(const Call &call, Landing *landing) {
    if (__builtin_expect(__sigsetjmp(reinterpret_cast<struct __jmp_buf_tag *>(landing->exit.__cancel_jmp_buf), 0), 0)) {
        // A forced unwind ran the callback's cleanups and jumped here.
        __pthread_unregister_cancel(&landing->exit);
        _pthread_cleanup_pop(&landing->jump, 0);
        landing->escape->kind = ESCAPE_EXIT;
        return -1;
    }
    __pthread_register_cancel(&landing->exit);
    _pthread_cleanup_push(&landing->jump, on_longjmp, landing);
    int rc = call();
    _pthread_cleanup_pop(&landing->jump, 0);
    __pthread_unregister_cancel(&landing->exit);
    return rc;
}

// Both catch clauses see C++ exceptions only (see `land`).
template <class Call>
int trampoline(const Call &call, mrcache_escape *escape) {
    Landing landing;
    landing.escape = escape;
    escape->kind = ESCAPE_RETURNED;
    try {
        return land(call, &landing);
    } catch (const std::exception &e) {
        describe(escape, e.what());
    } catch (...) {
        describe(escape, "an exception that is not a std::exception");
    }
    // The exception skipped `land`'s unregistering.
    _pthread_cleanup_pop(&landing.jump, 0);
    __pthread_unregister_cancel(&landing.exit);
    return -1;
}

}  // namespace

extern "C" int mrcache_escape_call_reg(const mrcache_escape_reg_call *c, mrcache_escape *escape) {
    return trampoline([c] { return c->reg(c->ctx, c->addr, c->len, c->access, c->handle, c->lkey, c->rkey); }, escape);
}

extern "C" int mrcache_escape_call_dereg(mrcache_escape_dereg_fn dereg, void *ctx, void *handle, mrcache_escape *escape) {
    return trampoline([=] { return dereg(ctx, handle); }, escape);
}

// The what() of the exception the last ESCAPE_THREW on this thread caught.
extern "C" const char *mrcache_escape_what(void) { return last_what; }

// Resumes a thread exit a trampoline stopped (ESCAPE_EXIT): the unwind goes
// on from the caller's frame to the caller's own cleanup buffers, and the
// thread ends with the value it passed to pthread_exit (glibc keeps it in
// the thread's descriptor).
extern "C" __attribute__((noreturn)) void mrcache_escape_resume_exit(void) {
    __pthread_unwind_buf_t here;
    // Links `here` to the innermost buffer of the caller's frames; unwinding
    // "next" from it starts at that one.
    __pthread_register_cancel(&here);
    __pthread_unwind_next(&here);
}
