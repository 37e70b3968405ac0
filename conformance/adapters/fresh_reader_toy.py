#!/usr/bin/env python3
"""A tiny in-process memory-registration cache behind the conformance
adapter protocol, version 1.

Written from docs/conformance-protocol.md alone (copy in this directory), by
a reader who had not seen the project's code, spec.md, or any other adapter.

Declares:
  policy         independent  (a miss registers exactly the page-rounded
                               request with exactly its access; cached
                               entries never merge or displace each other)
  caps           flush, limits, fork, pause, pause_mem
  page_size      4096
  access_classes null (exact rights), eviction lru

The "registrar" is fake (it pins nothing); the memory operations are real
system calls made through ctypes, and the cache's "monitor" is this adapter
itself: every memory command first tells the cache which pages it releases
(a pre-call hook, like UCX/Open MPI memhooks), then performs the call.
Python standard library only.
"""

import ctypes
import ctypes.util
import json
import os
import queue
import sys
import threading

PAGE = 4096
# FRESH_TOY_CAPS (comma list) only exists to check how the runner treats a
# cache that lacks capabilities; by default every implemented one is declared.
CAPS = ["flush", "limits", "fork", "pause", "pause_mem"]
if os.environ.get("FRESH_TOY_CAPS") is not None:
    CAPS = [c for c in os.environ["FRESH_TOY_CAPS"].split(",") if c]
ARENA_ADDR = 0x200000000000
ARENA_LEN = 4 << 20

# ---------------------------------------------------------------- libc --

libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                      ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.mremap.restype = ctypes.c_void_p
libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                        ctypes.c_int, ctypes.c_void_p]
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.sbrk.restype = ctypes.c_void_p
libc.sbrk.argtypes = [ctypes.c_ssize_t]
libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]

PROT_NONE, PROT_RW = 0, 3
MAP_PRIVATE, MAP_FIXED, MAP_ANON, MAP_NORESERVE = 0x02, 0x10, 0x20, 0x4000
MAP_FIXED_NOREPLACE = 0x100000
MADV_DONTNEED, MADV_FREE = 4, 8
MREMAP_MAYMOVE, MREMAP_FIXED = 1, 2
MAP_FAILED = ctypes.c_void_p(-1).value
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


class SysError(Exception):
    def __init__(self, what, err):
        super().__init__("%s: %s" % (what, os.strerror(err)))
        self.errno = err


def _check(ok, what):
    if not ok:
        raise SysError(what, ctypes.get_errno())


def touch(addr, length):
    ctypes.memset(addr, 0x5a, length)


def sys_mmap(addr, length, flags):
    p = libc.mmap(addr, length, PROT_RW, MAP_PRIVATE | MAP_ANON | flags, -1, 0)
    _check(p is not None and p != MAP_FAILED, "mmap")
    if addr and p != addr:  # an old kernel that ignores NOREPLACE
        libc.munmap(p, length)
        raise SysError("mmap", 17)
    return p


# ------------------------------------------------------------- output --

_out_lock = threading.Lock()


def emit(obj):
    line = json.dumps(obj, separators=(",", ":")) + "\n"
    with _out_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def log(*a):
    print("[fresh-toy %d]" % os.getpid(), *a, file=sys.stderr, flush=True)


# ------------------------------------------------------------- pauses --

_pause_events = {}          # thread -> threading.Event
_pause_lock = threading.Lock()


def pause_event(thread):
    with _pause_lock:
        ev = _pause_events.get(thread)
        if ev is None:
            ev = _pause_events[thread] = threading.Event()
        return ev


def pause_here(thread):
    ev = pause_event(thread)
    emit({"ev": "paused", "thread": thread})
    ev.wait()
    ev.clear()


# -------------------------------------------------------------- access --

ALL_RIGHTS = ("local_write", "remote_read", "remote_write", "remote_atomic")
ALIASES = {"rw": {"local_write", "remote_read", "remote_write"},
           "local_read": set(), "": set()}


def parse_access(s):
    rights = set()
    for part in str(s).split("+"):
        part = part.strip()
        if part in ALIASES:
            rights |= ALIASES[part]
        elif part in ALL_RIGHTS:
            rights.add(part)
        else:
            raise ValueError("unknown access right %r" % part)
    return frozenset(rights)


def access_str(rights):
    names = [r for r in ALL_RIGHTS if r in rights]
    return "+".join(names) if names else "local_read"


# --------------------------------------------------------------- cache --

class Reg:
    __slots__ = ("id", "lo", "hi", "rights", "refs", "cached", "foreign",
                 "used", "dead")

    def __init__(self, rid, lo, hi, rights):
        self.id, self.lo, self.hi, self.rights = rid, lo, hi, rights
        self.refs = 0
        self.cached = False
        self.foreign = False   # the parent's, seen in a fork child
        self.used = 0
        self.dead = False


class Inflight:
    __slots__ = ("lo", "hi", "stale")

    def __init__(self, lo, hi, stale):
        self.lo, self.hi, self.stale = lo, hi, stale


class Cache:
    """Registration cache, policy `independent`."""

    def __init__(self, max_regions=None, max_pinned_bytes=None):
        self.lock = threading.Lock()
        self.entries = []          # cached Regs
        self.inflight = []         # Inflight records of misses in progress
        self.pending = []          # [lo, hi) releases seen by the hook, not done
        self.next_id = 1
        self.clock = 0
        self.max_regions = max_regions
        self.max_pinned_bytes = max_pinned_bytes

    # the registrar ----------------------------------------------------
    def _register(self, lo, hi, rights, pause, thread):
        with self.lock:
            rid = self.next_id
            self.next_id += 1
        emit({"ev": "reg", "id": rid, "addr": hex(lo), "len": hi - lo,
              "access": access_str(rights)})
        if pause:
            pause_here(thread)
        return Reg(rid, lo, hi, rights)

    def _deregister(self, reg):          # called with self.lock held
        assert not reg.dead and not reg.foreign
        reg.dead = True
        emit({"ev": "dereg", "id": reg.id})

    # helpers (lock held) ---------------------------------------------
    def _tick(self, reg):
        self.clock += 1
        reg.used = self.clock

    def _lookup(self, lo, hi, rights):
        best = None
        for e in self.entries:
            if e.lo <= lo and hi <= e.hi and rights <= e.rights:
                if best is None or e.used > best.used:
                    best = e
        return best

    def _over(self, extra_regions=0, extra_bytes=0):
        if self.max_regions is not None and \
                len(self.entries) + extra_regions > self.max_regions:
            return True
        if self.max_pinned_bytes is not None and \
                sum(e.hi - e.lo for e in self.entries) + extra_bytes > \
                self.max_pinned_bytes:
            return True
        return False

    def _uncache(self, e):
        self.entries.remove(e)
        e.cached = False
        if e.refs == 0:
            self._deregister(e)

    def _evict(self, extra_regions=0, extra_bytes=0):
        while self._over(extra_regions, extra_bytes):
            idle = [e for e in self.entries if e.refs == 0]
            if not idle:
                return          # everything leased: over-commit until a release
            self._uncache(min(idle, key=lambda e: e.used))

    @staticmethod
    def _overlaps(a_lo, a_hi, b_lo, b_hi):
        return a_lo < b_hi and b_lo < a_hi

    # operations ------------------------------------------------------
    def acquire(self, addr, length, rights, pause=False, thread=0):
        lo = addr & ~(PAGE - 1)
        hi = (addr + max(length, 1) + PAGE - 1) & ~(PAGE - 1)
        with self.lock:
            e = self._lookup(lo, hi, rights)
            if e is not None:                      # hit
                e.refs += 1
                self._tick(e)
                return e
            stale = any(self._overlaps(lo, hi, p[0], p[1]) for p in self.pending)
            rec = Inflight(lo, hi, stale)
            self.inflight.append(rec)
            self._evict(1, hi - lo)                # make room first
        reg = self._register(lo, hi, rights, pause, thread)
        with self.lock:
            self.inflight.remove(rec)
            if rec.stale or any(self._overlaps(lo, hi, p[0], p[1])
                                for p in self.pending):
                # pinned frames that were (being) released: serve this lease
                # only, never cache; deregistered at its last release
                reg.refs = 1
                return reg
            e = self._lookup(lo, hi, rights)
            if e is not None:                      # lost a concurrent miss (A8)
                self._deregister(reg)
                e.refs += 1
                self._tick(e)
                return e
            reg.refs = 1
            reg.cached = True
            self._tick(reg)
            self.entries.append(reg)
            self._evict(0, 0)
            return reg

    def release(self, reg):
        with self.lock:
            reg.refs -= 1
            assert reg.refs >= 0
            if reg.refs == 0:
                if not reg.cached:
                    if not reg.foreign and not reg.dead:
                        self._deregister(reg)
                else:
                    self._evict()

    def flush(self):
        with self.lock:
            for e in list(self.entries):
                self._uncache(e)
            for rec in self.inflight:
                rec.stale = True

    def hook_release(self, lo, hi):
        """Memory monitor: pages [lo, hi) are about to be released."""
        lo &= ~(PAGE - 1)
        hi = (hi + PAGE - 1) & ~(PAGE - 1)
        if hi <= lo:
            return None
        with self.lock:
            p = [lo, hi]
            self.pending.append(p)
            for e in list(self.entries):
                if self._overlaps(lo, hi, e.lo, e.hi):
                    self._uncache(e)
            for rec in self.inflight:
                if self._overlaps(lo, hi, rec.lo, rec.hi):
                    rec.stale = True
            return p

    def hook_done(self, p):
        """The release the hook saw has taken effect."""
        if p is None:
            return
        with self.lock:
            self.pending.remove(p)

    def after_fork_child(self, regs):
        """A fork counts as a release of everything; the parent's
        registrations are not ours to deregister."""
        with self.lock:
            for r in regs:
                r.foreign = True
                r.cached = False
            self.entries = []
            self.inflight = []
            self.pending = []


# ------------------------------------------------------------- adapter --

def num(v):
    if isinstance(v, str):
        return int(v, 16) if v.lower().startswith("0x") else int(v)
    return int(v)


class Adapter:
    def __init__(self):
        self.cache = None
        self.leases = {}            # lease name -> Reg
        self.all_regs = {}          # id -> Reg (for fork)
        self.blocks = {}            # malloc addr -> len
        self.workers = {}           # thread -> (queue, state)
        self.busy = 0
        self.busy_cv = threading.Condition()

    # --- workers ---
    def dispatch(self, msg):
        t = int(msg.get("thread", 0) or 0)
        w = self.workers.get(t)
        if w is None:
            q = queue.Queue()
            th = threading.Thread(target=self.worker, args=(t, q), daemon=True)
            self.workers[t] = q
            th.start()
            w = q
        with self.busy_cv:
            self.busy += 1
        w.put(msg)

    def worker(self, t, q):
        while True:
            msg = q.get()
            try:
                self.run(msg, t)
            finally:
                with self.busy_cv:
                    self.busy -= 1
                    self.busy_cv.notify_all()

    def wait_idle(self):
        with self.busy_cv:
            while self.busy:
                self.busy_cv.wait()

    def run(self, msg, t):
        seq = msg.get("seq")
        try:
            extra = self.execute(msg, t) or {}
            reply = {"seq": seq, "ok": True}
            reply.update(extra)
        except SysError as e:
            reply = {"seq": seq, "ok": False, "error": str(e), "errno": e.errno}
        except NotImplementedError as e:
            reply = {"seq": seq, "ok": False, "error": str(e),
                     "unsupported": True}
        except Exception as e:  # noqa: BLE001
            log("error in", msg, repr(e))
            reply = {"seq": seq, "ok": False, "error": repr(e)}
        emit(reply)

    # --- memory operations: hook, optional pause, then the call ---
    def mem(self, lo, hi, pause, t, call):
        p = self.cache.hook_release(lo, hi) if hi > lo else None
        try:
            if pause:
                pause_here(t)
            return call()
        finally:
            self.cache.hook_done(p)

    def execute(self, m, t):
        cmd = m.get("cmd")
        pause = bool(m.get("pause", False))
        c = self.cache
        if cmd == "acquire":
            reg = c.acquire(num(m["addr"]), num(m["len"]),
                            parse_access(m["access"]), pause, t)
            with c.lock:
                self.all_regs[reg.id] = reg
            self.leases[m["lease"]] = reg
            return {"reg": reg.id}
        if cmd == "release":
            reg = self.leases.pop(m["lease"])
            c.release(reg)
            return None
        if cmd == "flush":
            c.flush()
            return None
        if cmd == "munmap":
            a, n = num(m["addr"]), num(m["len"])
            self.mem(a, a + n, pause, t,
                     lambda: _check(libc.munmap(a, n) == 0, "munmap"))
            return None
        if cmd == "mmap":
            a, n = num(m["addr"]), num(m["len"])
            if pause:
                pause_here(t)
            sys_mmap(a, n, MAP_FIXED_NOREPLACE)
            touch(a, n)
            return None
        if cmd == "mmap_fixed":
            a, n = num(m["addr"]), num(m["len"])
            self.mem(a, a + n, pause, t, lambda: sys_mmap(a, n, MAP_FIXED))
            touch(a, n)
            return None
        if cmd in ("madvise_dontneed", "madvise_free"):
            a, n = num(m["addr"]), num(m["len"])
            adv = MADV_DONTNEED if cmd == "madvise_dontneed" else MADV_FREE
            self.mem(a, a + n, pause, t,
                     lambda: _check(libc.madvise(a, n, adv) == 0, "madvise"))
            return None
        if cmd == "mremap_move":
            a, n = num(m["addr"]), num(m["len"])
            target = libc.mmap(None, n, PROT_NONE,
                               MAP_PRIVATE | MAP_ANON | MAP_NORESERVE, -1, 0)
            _check(target not in (None, MAP_FAILED), "mmap(target)")

            def call():
                r = libc.mremap(a, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, target)
                _check(r not in (None, MAP_FAILED), "mremap")
            self.mem(a, a + n, pause, t, call)
            return None
        if cmd == "mremap_shrink":
            a, n, nn = num(m["addr"]), num(m["len"]), num(m["new_len"])

            def call():
                r = libc.mremap(a, n, nn, 0, None)
                _check(r not in (None, MAP_FAILED), "mremap")
            self.mem(a + nn, a + n, pause, t, call)
            return None
        if cmd == "malloc":
            n = num(m["len"])
            if pause:
                pause_here(t)
            p = libc.malloc(n)
            _check(p, "malloc")
            touch(p, n)
            self.blocks[p] = n
            return {"addr": hex(p)}
        if cmd == "free":
            a = num(m["addr"])
            self.blocks.pop(a, None)
            # glibc: an mmap-served chunk (IS_MMAPPED bit in its size word)
            # goes back to the kernel on free; a heap chunk does not.
            size_word = ctypes.c_size_t.from_address(a - ctypes.sizeof(ctypes.c_size_t)).value
            if size_word & 2:
                chunk = size_word & ~7
                prev = ctypes.c_size_t.from_address(a - 2 * ctypes.sizeof(ctypes.c_size_t)).value
                start = a - 2 * ctypes.sizeof(ctypes.c_size_t) - prev
                lo, hi = start, start + prev + chunk
            else:
                lo = hi = 0
            self.mem(lo, hi, pause, t, lambda: libc.free(a))
            return None
        if cmd == "brk_grow":
            n = num(m["len"])
            if pause:
                pause_here(t)
            cur = libc.sbrk(0)
            start = (cur + PAGE - 1) & ~(PAGE - 1)
            r = libc.sbrk(start - cur + n)
            _check(r not in (None, MAP_FAILED), "sbrk")
            touch(start, n)
            return {"addr": hex(start)}
        if cmd == "brk_shrink":
            n = num(m["len"])
            cur = libc.sbrk(0)

            def call():
                r = libc.sbrk(-n)
                _check(r not in (None, MAP_FAILED), "sbrk")
            self.mem(cur - n, cur, pause, t, call)
            return None
        raise NotImplementedError("command %r" % cmd)

    # --- main loop (stdin reader) ---
    def hello(self, m):
        cfg = m.get("config") or {}
        mr = cfg.get("max_regions")
        mb = cfg.get("max_pinned_bytes")
        self.cache = Cache(None if mr is None else num(mr),
                           None if mb is None else num(mb))
        libc.mallopt(M_MMAP_THRESHOLD, 1)   # keep malloc off the brk heap
        libc.mallopt(M_TRIM_THRESHOLD, 1 << 30)
        sys_mmap(ARENA_ADDR, ARENA_LEN, MAP_FIXED_NOREPLACE)
        touch(ARENA_ADDR, ARENA_LEN)
        emit({"seq": m["seq"], "ok": True, "protocol": 1,
              "name": "fresh-reader-toy", "version": "1",
              "policy": "independent", "page_size": PAGE,
              "caps": CAPS,
              "access_classes": None, "eviction": "lru",
              "limits": {"max_regions": self.cache.max_regions,
                         "max_pinned_bytes": self.cache.max_pinned_bytes},
              "arena": {"addr": hex(ARENA_ADDR), "len": ARENA_LEN}})

    def do_fork(self, m):
        self.wait_idle()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:                       # parent: read nothing more
            _, status = os.waitpid(pid, 0)
            os._exit(os.waitstatus_to_exitcode(status) & 0xff)
        # child: worker threads did not survive the fork
        global _out_lock, _pause_lock, _pause_events
        _out_lock = threading.Lock()
        _pause_lock = threading.Lock()
        _pause_events = {}
        self.workers = {}
        self.busy = 0
        self.busy_cv = threading.Condition()
        self.cache.lock = threading.Lock()
        self.cache.after_fork_child(list(self.all_regs.values()))
        emit({"seq": m["seq"], "ok": True})

    def main(self):
        stdin = sys.stdin.buffer
        while True:
            line = stdin.readline()
            if not line:
                self.wait_idle()
                os._exit(0)
            line = line.strip()
            if not line:
                continue
            m = json.loads(line)
            cmd = m.get("cmd")
            if cmd == "hello":
                try:
                    self.hello(m)
                except SysError as e:
                    emit({"seq": m.get("seq"), "ok": False, "error": str(e),
                          "errno": e.errno})
            elif cmd == "continue":
                emit({"seq": m["seq"], "ok": True})
                pause_event(int(m.get("thread", 0))).set()
            elif cmd == "fork":
                self.do_fork(m)
            elif cmd == "end":
                self.wait_idle()
                emit({"seq": m["seq"], "ok": True})
                os._exit(0)
            else:
                self.dispatch(m)


if __name__ == "__main__":
    Adapter().main()
