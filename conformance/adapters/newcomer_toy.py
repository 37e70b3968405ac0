#!/usr/bin/env python3
"""A toy registration cache and its conformance adapter, written from
docs/conformance-protocol.md alone (the "newcomer" check of issue 13).

The cache: a list of entries, independent overlap policy (S6.1), a fake
registrar that only reports its calls. Its monitor is explicit: after each
memory call the adapter performs, it invalidates the released pages. No
pause, no limits (those cases come out `unsupported`); fork is supported
(single-threaded, so the child simply carries on).

    mrcache conform --adapter 'python3 conformance/adapters/newcomer_toy.py'
"""
import ctypes
import ctypes.util
import json
import os
import sys

PAGE = 4096
ARENA_LEN = 4 << 20
ARENA_HINT = 0x200000000000

libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.mremap.restype = ctypes.c_void_p
libc.mremap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.malloc_usable_size.restype = ctypes.c_size_t
libc.malloc_usable_size.argtypes = [ctypes.c_void_p]
libc.sbrk.restype = ctypes.c_void_p
libc.sbrk.argtypes = [ctypes.c_long]
libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]

PROT_NONE, PROT_RW = 0, 3
MAP_PRIVATE, MAP_ANONYMOUS, MAP_FIXED, MAP_FIXED_NOREPLACE = 0x02, 0x20, 0x10, 0x100000
MADV_DONTNEED, MADV_FREE = 4, 8
MREMAP_MAYMOVE, MREMAP_FIXED = 1, 2
M_MMAP_THRESHOLD = -3
MAP_FAILED = ctypes.c_void_p(-1).value

RIGHTS = {"local_write": 1, "remote_read": 2, "remote_write": 4, "remote_atomic": 8}


def parse_access(s):
    bits = 0
    for part in s.split("+"):
        if part == "rw":
            bits |= 1 | 2 | 4
        else:
            bits |= RIGHTS.get(part, 0)
    return bits


def access_name(bits):
    names = [n for n, b in RIGHTS.items() if bits & b]
    return "+".join(names) if names else "local_read"


def num(v):
    return int(v, 16) if isinstance(v, str) and v.startswith("0x") else int(v)


def out(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class OsError(Exception):
    def __init__(self, what):
        e = ctypes.get_errno()
        super().__init__(f"{what}: {os.strerror(e)}")
        self.errno = e


class Toy:
    def __init__(self):
        self.entries = []  # dicts: id, first, end (pages), access, findable, leases
        self.leases = {}  # lease -> entry id
        self.orphans = set()
        self.next_id = 0

    def entry(self, eid):
        return next(e for e in self.entries if e["id"] == eid)

    def register(self, first, end, access):
        self.next_id += 1
        out({"ev": "reg", "id": self.next_id, "addr": hex(first * PAGE), "len": (end - first) * PAGE,
             "access": access_name(access)})
        return self.next_id

    def dereg(self, e):
        self.entries.remove(e)
        out({"ev": "dereg", "id": e["id"]})

    def acquire(self, lease, addr, length, access):
        first, end = addr // PAGE, (addr + length + PAGE - 1) // PAGE
        for e in self.entries:  # oldest first
            if e["findable"] and e["first"] <= first and end <= e["end"] and e["access"] & access == access:
                e["leases"] += 1
                self.leases[lease] = e["id"]
                return e["id"]
        eid = self.register(first, end, access)
        self.entries.append({"id": eid, "first": first, "end": end, "access": access, "findable": True, "leases": 1})
        self.leases[lease] = eid
        return eid

    def release(self, lease):
        if lease in self.orphans:
            self.orphans.discard(lease)
            return
        e = self.entry(self.leases.pop(lease))
        e["leases"] -= 1
        if not e["findable"] and e["leases"] == 0:
            self.dereg(e)

    def uncache(self, e):
        e["findable"] = False
        if e["leases"] == 0:
            self.dereg(e)

    def invalidate(self, addr, length):
        first, end = addr // PAGE, (addr + length + PAGE - 1) // PAGE
        for e in list(self.entries):
            if e["findable"] and e["first"] < end and first < e["end"]:
                self.uncache(e)

    def flush(self):
        for e in list(self.entries):
            if e["findable"]:
                self.uncache(e)

    def forked(self):
        self.entries = []
        self.orphans |= set(self.leases)
        self.leases = {}


def fresh(addr, length, flags):
    p = libc.mmap(addr, length, PROT_RW, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0)
    if p == MAP_FAILED:
        raise OsError("mmap")
    if p != addr:
        raise OsError("mmap placed the pages elsewhere")
    ctypes.memset(addr, 0x5A, length)


def memory(toy, cmd, c):
    """Performs a memory command; returns the reply's extra fields."""
    if cmd == "malloc":
        p = libc.malloc(c["len"])
        ctypes.memset(p, 0x5A, c["len"])
        return {"addr": hex(p)}
    if cmd == "brk_grow":
        cur = libc.sbrk(0)
        top = (cur + PAGE - 1) // PAGE * PAGE
        if libc.sbrk(top - cur + c["len"]) == MAP_FAILED:
            raise OsError("sbrk")
        ctypes.memset(top, 0x5A, c["len"])
        return {"addr": hex(top)}
    if cmd == "mmap":
        fresh(num(c["addr"]), c["len"], MAP_FIXED_NOREPLACE)
        return {}
    # A release: perform it, then tell the cache (our monitor runs after).
    if cmd == "munmap":
        addr, length = num(c["addr"]), c["len"]
        if libc.munmap(addr, length):
            raise OsError("munmap")
    elif cmd == "mmap_fixed":
        addr, length = num(c["addr"]), c["len"]
        fresh(addr, length, MAP_FIXED)
    elif cmd in ("madvise_dontneed", "madvise_free"):
        addr, length = num(c["addr"]), c["len"]
        if libc.madvise(addr, length, MADV_DONTNEED if cmd == "madvise_dontneed" else MADV_FREE):
            raise OsError("madvise")
    elif cmd == "mremap_move":
        addr, length = num(c["addr"]), c["len"]
        t = libc.mmap(None, length, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
        if libc.mremap(addr, length, length, MREMAP_MAYMOVE | MREMAP_FIXED, t) != t:
            raise OsError("mremap")
    elif cmd == "mremap_shrink":
        addr, new_len = num(c["addr"]), c["new_len"]
        if libc.mremap(addr, c["len"], new_len, 0, None) == MAP_FAILED:
            raise OsError("mremap")
        addr, length = addr + new_len, c["len"] - new_len
    elif cmd == "free":
        p = num(c["addr"])
        addr, length = p - 16, libc.malloc_usable_size(p) + 16
        libc.free(p)
    elif cmd == "brk_shrink":
        length = c["len"]
        addr = libc.sbrk(0) - length
        if libc.sbrk(-length) == MAP_FAILED:
            raise OsError("sbrk")
    else:
        return None
    toy.invalidate(addr, length)
    return {}


def main():
    libc.mallopt(M_MMAP_THRESHOLD, 1)  # keep allocations off the brk heap
    hello = json.loads(sys.stdin.readline())
    arena = libc.mmap(ARENA_HINT, ARENA_LEN, PROT_RW, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0)
    if arena == MAP_FAILED:
        arena = libc.mmap(None, ARENA_LEN, PROT_RW, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    ctypes.memset(arena, 0, ARENA_LEN)
    out({"seq": hello["seq"], "ok": True, "protocol": 1, "name": "newcomer-toy (python)", "version": "1",
         "policy": "independent", "page_size": PAGE, "caps": ["flush", "fork"],
         "limits": {"max_regions": None, "max_pinned_bytes": None},
         "arena": {"addr": hex(arena), "len": ARENA_LEN}})
    toy = Toy()
    for line in sys.stdin:
        if not line.strip():
            continue
        c = json.loads(line)
        seq, cmd = c["seq"], c["cmd"]
        try:
            if cmd == "acquire":
                out({"seq": seq, "ok": True, "reg": toy.acquire(c["lease"], num(c["addr"]), c["len"], parse_access(c["access"]))})
            elif cmd == "release":
                toy.release(c["lease"])
                out({"seq": seq, "ok": True})
            elif cmd == "flush":
                toy.flush()
                out({"seq": seq, "ok": True})
            elif cmd == "fork":
                sys.stdout.flush()
                pid = os.fork()
                if pid:
                    _, status = os.waitpid(pid, 0)
                    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
                toy.forked()
                out({"seq": seq, "ok": True})
            elif cmd == "end":
                out({"seq": seq, "ok": True})
                return
            elif c.get("pause"):
                out({"seq": seq, "ok": False, "unsupported": True, "error": "no pause"})
            else:
                extra = memory(toy, cmd, c)
                if extra is None:
                    out({"seq": seq, "ok": False, "unsupported": True, "error": f"no command {cmd}"})
                else:
                    out(dict({"seq": seq, "ok": True}, **extra))
        except OsError as e:
            out({"seq": seq, "ok": False, "error": str(e), "errno": e.errno})


if __name__ == "__main__":
    main()
