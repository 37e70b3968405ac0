//! `pthread_cancel` of a thread inside a registrar callback (the header's
//! "Callbacks"): the library disables cancellation while it runs a
//! callback, so a cancel requested meanwhile acts at the thread's next
//! cancellation point after the library returned. Before, glibc's forced
//! unwind crossed the library's frames, the entry point's `catch_unwind`
//! caught it, and the process aborted ("FATAL: exception not rethrown").
//!
//! A failure here can be an abort of this test binary, or a hang (the
//! watchdog exits the process after a minute).

use mrcache_capi::mrcache_monitor_t::*;
use mrcache_capi::mrcache_status_t::*;
use mrcache_capi::*;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const LEN: usize = 64 << 10;
const PTHREAD_CANCEL_DISABLE: c_int = 1;
const PTHREAD_CANCEL_ENABLE: c_int = 0;
/// glibc's and musl's `PTHREAD_CANCELED`.
const PTHREAD_CANCELED: *mut c_void = -1isize as *mut c_void;

extern "C" {
    fn pthread_setcancelstate(state: c_int, oldstate: *mut c_int) -> c_int;
}
extern "C-unwind" {
    /// A cancellation point: a pending cancel unwinds (forced) from here.
    fn pthread_testcancel();
}

/// The callbacks' context, and what the worker thread saw.
struct Blocking {
    /// The reg callback reads one byte from `pipe[0]` before it registers.
    pipe: [c_int; 2],
    entered: AtomicBool,
    registered: AtomicU64,
    deregistered: AtomicU64,
    /// The cancel state the reg callback ran with.
    state_in_reg: AtomicI32,
    state_in_dereg: AtomicI32,
    cache: AtomicUsize,
    addr: AtomicUsize,
    acquired: AtomicI32,
    released: AtomicI32,
    /// The worker got past its acquire and release.
    returned: AtomicBool,
    /// The worker got past `pthread_testcancel`: must stay false.
    survived: AtomicBool,
}

impl Blocking {
    fn new() -> Blocking {
        let mut pipe = [-1; 2];
        // SAFETY: a valid out-array of two fds.
        assert_eq!(unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        Blocking {
            pipe,
            entered: AtomicBool::new(false),
            registered: AtomicU64::new(0),
            deregistered: AtomicU64::new(0),
            state_in_reg: AtomicI32::new(-1),
            state_in_dereg: AtomicI32::new(-1),
            cache: AtomicUsize::new(0),
            addr: AtomicUsize::new(0),
            acquired: AtomicI32::new(-1),
            released: AtomicI32::new(-1),
            returned: AtomicBool::new(false),
            survived: AtomicBool::new(false),
        }
    }

    fn registrar(&self) -> mrcache_registrar_t {
        mrcache_registrar_t { ctx: self as *const Blocking as *mut c_void, reg: Some(blocking_reg), dereg: Some(dereg) }
    }
}

impl Drop for Blocking {
    fn drop(&mut self) {
        for fd in self.pipe {
            // SAFETY: our pipe's fds, closed once.
            unsafe { libc::close(fd) };
        }
    }
}

/// This thread's cancel state (left as it is).
fn cancel_state() -> c_int {
    let mut old = -1;
    // SAFETY: valid state and out-pointer; the second call puts back what
    // the first read.
    unsafe {
        pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &mut old);
        pthread_setcancelstate(old, null_mut());
    }
    old
}

unsafe extern "C" fn blocking_reg(
    ctx: *mut c_void,
    addr: *mut c_void,
    _len: usize,
    _access: u32,
    handle: *mut *mut c_void,
    lkey: *mut u32,
    rkey: *mut u32,
) -> c_int {
    // SAFETY: `ctx` is the test's `Blocking`, alive until the cache is destroyed.
    let b = unsafe { &*(ctx as *const Blocking) };
    b.state_in_reg.store(cancel_state(), Ordering::SeqCst);
    b.entered.store(true, Ordering::SeqCst);
    let mut byte = 0u8;
    // A cancellation point (as the system calls of a real ibv_reg_mr are):
    // blocks until the test writes a byte.
    // SAFETY: one byte into a local.
    let n = unsafe { libc::read(b.pipe[0], (&mut byte as *mut u8).cast(), 1) };
    if n != 1 {
        return libc::EIO;
    }
    let n = b.registered.fetch_add(1, Ordering::SeqCst) + 1;
    // SAFETY: the library's out-pointers.
    unsafe {
        *handle = addr;
        *lkey = n as u32;
        *rkey = n as u32;
    }
    0
}

unsafe extern "C" fn dereg(ctx: *mut c_void, _handle: *mut c_void) -> c_int {
    // SAFETY: as in `blocking_reg`.
    let b = unsafe { &*(ctx as *const Blocking) };
    b.state_in_dereg.store(cancel_state(), Ordering::SeqCst);
    b.deregistered.fetch_add(1, Ordering::SeqCst);
    0
}

/// The cancelled thread: acquires (its reg callback blocks), releases,
/// then reaches a cancellation point. Raw pointers and atomics only: no
/// frame of it has a destructor, so the cancel's forced unwind may cross
/// it ("C-unwind").
extern "C-unwind" fn worker(arg: *mut c_void) -> *mut c_void {
    let b = arg as *const Blocking;
    // SAFETY: `arg` is the test's `Blocking`, alive until this thread is
    // joined; the cache is live.
    unsafe {
        let cache = (*b).cache.load(Ordering::SeqCst) as *mut mrcache_t;
        let mut lease = mrcache_lease_t::default();
        let st = mrcache_acquire(cache, (*b).addr.load(Ordering::SeqCst) as *const c_void, LEN, 0, &mut lease);
        (*b).acquired.store(st as i32, Ordering::SeqCst);
        if st == MRCACHE_OK {
            (*b).released.store(mrcache_release(cache, lease) as i32, Ordering::SeqCst);
        }
        (*b).returned.store(true, Ordering::SeqCst);
        pthread_testcancel();
        (*b).survived.store(true, Ordering::SeqCst);
    }
    null_mut()
}

fn create(b: &Blocking) -> *mut mrcache_t {
    let mut cfg = std::mem::MaybeUninit::<mrcache_config_t>::uninit();
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { mrcache_config_init(cfg.as_mut_ptr()) }, MRCACHE_OK);
    // SAFETY: initialised just above.
    let mut cfg = unsafe { cfg.assume_init() };
    cfg.monitor = MRCACHE_MONITOR_NONE as u32;
    let r = b.registrar();
    let mut cache = null_mut();
    // SAFETY: valid pointers.
    assert_eq!(unsafe { mrcache_create(&cfg, &r, &mut cache) }, MRCACHE_OK);
    b.cache.store(cache as usize, Ordering::SeqCst);
    cache
}

/// Exits the process if the test has not finished within a minute.
fn watchdog(done: &'static AtomicBool) {
    std::thread::spawn(move || {
        let start = Instant::now();
        while !done.load(Ordering::SeqCst) {
            if start.elapsed() > Duration::from_secs(60) {
                eprintln!("cancel test: timed out");
                std::process::exit(2);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
}

fn wait_for(what: &str, f: impl Fn() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < Duration::from_secs(30), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_thread_cancelled_inside_its_reg_callback_is_cancelled_after_the_call() {
    static DONE: AtomicBool = AtomicBool::new(false);
    watchdog(&DONE);
    let b = Blocking::new();
    let cache = create(&b);
    let mem = vec![0u8; 2 * LEN];
    b.addr.store(mem.as_ptr() as usize, Ordering::SeqCst);
    // SAFETY: zeroed is a valid pthread_t to overwrite.
    let mut t: libc::pthread_t = unsafe { std::mem::zeroed() };
    // SAFETY: `worker` has the start routine's signature ("C-unwind" is
    // the C calling convention); `b` outlives the thread (joined below).
    let rc = unsafe {
        let start: extern "C" fn(*mut c_void) -> *mut c_void =
            std::mem::transmute(worker as extern "C-unwind" fn(*mut c_void) -> *mut c_void);
        libc::pthread_create(&mut t, std::ptr::null(), start, &b as *const Blocking as *mut c_void)
    };
    assert_eq!(rc, 0);
    wait_for("the reg callback", || b.entered.load(Ordering::SeqCst));
    // Let it reach its read.
    std::thread::sleep(Duration::from_millis(50));
    // SAFETY: a live thread of ours, not yet joined.
    assert_eq!(unsafe { libc::pthread_cancel(t) }, 0);
    // The cancel does not act inside the callback: it stays in its read.
    std::thread::sleep(Duration::from_millis(50));
    assert!(!b.returned.load(Ordering::SeqCst), "the acquire returned before its reg callback could");
    let byte = 1u8;
    // SAFETY: one byte from a local.
    assert_eq!(unsafe { libc::write(b.pipe[1], (&byte as *const u8).cast(), 1) }, 1);
    let mut ret = null_mut();
    // SAFETY: joined once.
    assert_eq!(unsafe { libc::pthread_join(t, &mut ret) }, 0);
    assert_eq!(ret, PTHREAD_CANCELED, "the thread was cancelled (at its pthread_testcancel)");
    assert!(b.returned.load(Ordering::SeqCst), "the cancel acted after the library returned");
    assert!(!b.survived.load(Ordering::SeqCst), "the pending cancel acted at the next cancellation point");
    assert_eq!(b.acquired.load(Ordering::SeqCst), MRCACHE_OK as i32, "the registration completed");
    assert_eq!(b.released.load(Ordering::SeqCst), MRCACHE_OK as i32);
    assert_eq!(b.state_in_reg.load(Ordering::SeqCst), PTHREAD_CANCEL_DISABLE, "reg runs with cancellation disabled");
    let mut s = mrcache_stats_t { size: std::mem::size_of::<mrcache_stats_t>() as u32, ..Default::default() };
    // SAFETY: a live cache; valid out-pointer.
    unsafe {
        assert_eq!(mrcache_stats(cache, &mut s), MRCACHE_OK);
        assert_eq!(s.leases_held, 0);
        assert_eq!(mrcache_destroy(cache), MRCACHE_OK);
    }
    assert_eq!(b.state_in_dereg.load(Ordering::SeqCst), PTHREAD_CANCEL_DISABLE, "dereg runs with cancellation disabled");
    assert_eq!(b.registered.load(Ordering::SeqCst), 1);
    assert_eq!(b.registered.load(Ordering::SeqCst), b.deregistered.load(Ordering::SeqCst));
    drop(mem);
    DONE.store(true, Ordering::SeqCst);
}

/// The caller's cancel state is put back as it was after a callback: still
/// enabled if it was, still disabled if the caller had disabled it.
#[test]
fn the_callers_cancel_state_is_kept() {
    let b = Blocking::new();
    let cache = create(&b);
    let mem = vec![0u8; 4 * LEN];
    let byte = [1u8; 2];
    // SAFETY: two bytes from a local: one per registration below.
    assert_eq!(unsafe { libc::write(b.pipe[1], byte.as_ptr().cast(), 2) }, 2);
    let mut lease = mrcache_lease_t::default();
    for (i, state) in [PTHREAD_CANCEL_ENABLE, PTHREAD_CANCEL_DISABLE].into_iter().enumerate() {
        let mut old = -1;
        // SAFETY: a valid state and out-pointer.
        unsafe { pthread_setcancelstate(state, &mut old) };
        // SAFETY: a live cache, valid pointers.
        unsafe {
            let addr = mem.as_ptr().add(2 * i * LEN).cast();
            assert_eq!(mrcache_acquire(cache, addr, LEN, 0, &mut lease), MRCACHE_OK);
            assert_eq!(mrcache_release(cache, lease), MRCACHE_OK);
            assert_eq!(mrcache_flush(cache), MRCACHE_OK, "deregisters");
        }
        assert_eq!(cancel_state(), state, "after a reg and a dereg");
        // SAFETY: puts back the state from before.
        unsafe { pthread_setcancelstate(old, null_mut()) };
    }
    // SAFETY: a live cache, no lease held.
    assert_eq!(unsafe { mrcache_destroy(cache) }, MRCACHE_OK);
    assert_eq!(b.registered.load(Ordering::SeqCst), 2);
    assert_eq!(b.deregistered.load(Ordering::SeqCst), 2);
}

unsafe extern "C" fn quick_reg(
    _ctx: *mut c_void,
    addr: *mut c_void,
    _len: usize,
    _access: u32,
    handle: *mut *mut c_void,
    lkey: *mut u32,
    rkey: *mut u32,
) -> c_int {
    // SAFETY: the library's out-pointers.
    unsafe {
        *handle = addr;
        *lkey = 1;
        *rkey = 1;
    }
    0
}

unsafe extern "C" fn quick_dereg(_ctx: *mut c_void, _handle: *mut c_void) -> c_int {
    0
}

/// What the cancel-state guard costs on a miss: two pairs of
/// `pthread_setcancelstate` calls (one around reg, one around dereg) next
/// to a miss (acquire, release, invalidate: reg and dereg) with callbacks
/// that do nothing. Prints `name ns`; run with
/// `cargo test --release -p mrcache-capi --test cancel -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement"]
fn cancel_guard_cost() {
    const N: usize = 200_000;
    let best = |f: &mut dyn FnMut()| {
        (0..5)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_nanos() as f64 / N as f64
            })
            .fold(f64::INFINITY, f64::min)
    };
    let pair = best(&mut || {
        for _ in 0..N {
            let mut old = -1;
            // SAFETY: as in the library's guard.
            unsafe {
                pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, std::hint::black_box(&mut old));
                pthread_setcancelstate(std::hint::black_box(old), null_mut());
            }
        }
    });
    let mut cfg = std::mem::MaybeUninit::<mrcache_config_t>::uninit();
    // SAFETY: a valid out-pointer.
    assert_eq!(unsafe { mrcache_config_init(cfg.as_mut_ptr()) }, MRCACHE_OK);
    // SAFETY: initialised just above.
    let mut cfg = unsafe { cfg.assume_init() };
    cfg.monitor = MRCACHE_MONITOR_EXPLICIT as u32;
    let r = mrcache_registrar_t { ctx: null_mut(), reg: Some(quick_reg), dereg: Some(quick_dereg) };
    let mut cache = null_mut();
    // SAFETY: valid pointers.
    assert_eq!(unsafe { mrcache_create(&cfg, &r, &mut cache) }, MRCACHE_OK);
    let addr = (1usize << 32) as *const c_void;
    let miss = best(&mut || {
        for _ in 0..N {
            let mut l = mrcache_lease_t::default();
            // SAFETY: a live cache, valid pointers; the callbacks never touch the memory.
            unsafe {
                assert_eq!(mrcache_acquire(cache, addr, LEN, 0, &mut l), MRCACHE_OK);
                assert_eq!(mrcache_release(cache, l), MRCACHE_OK);
                assert_eq!(mrcache_invalidate(cache, addr, LEN), MRCACHE_OK);
            }
        }
    });
    // SAFETY: no lease held.
    assert_eq!(unsafe { mrcache_destroy(cache) }, MRCACHE_OK);
    println!("setcancelstate_disable_restore_pair {pair:.1}");
    println!("miss_acquire_release_invalidate {miss:.1}");
}
