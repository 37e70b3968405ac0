#!/usr/bin/env python3
"""Instructions and locked (atomic read-modify-write) instructions per operation, by callgrind.

A locked instruction (`lock`-prefixed, or `xchg` with memory; `mfence` is counted with them)
is a full barrier on x86: it
drains the store buffer and costs tens of cycles even uncontended, which an instruction count
does not show. This runs a command under callgrind at two run lengths and divides the
difference by the difference in operations, so set-up and warm-up cancel out:

    python3 bench/peers/locked_ops.py 50000 100000 -- target/peers/bin/pb_mrc evict 2000 1000 {n}

`{n}` in the command is replaced by each run length (the operations counted). Prints, per
operation: all instructions, locked ones, and the source sites of the locked ones (through
`addr2line -i`, so build with line tables to see them: `CARGO_PROFILE_RELEASE_DEBUG=line-tables-only`).
Deterministic: the machine's load does not change the counts.
"""
import collections
import os
import re
import subprocess
import sys
import signal
import tempfile

LOCKED = re.compile(r"^(lock\s|xchg\s+%\w+,\s*(-?0x[0-9a-f]+)?\(|xchg\s+(-?0x[0-9a-f]+)?\(|mfence)")


def run(cmd, n, out):
    argv = [a.replace("{n}", str(n)) for a in cmd]
    subprocess.run(["valgrind", "--tool=callgrind", "--dump-instr=yes", "--compress-pos=no",
                    "--compress-strings=no", f"--callgrind-out-file={out}"] + argv,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def costs(path):
    """Self cost per (object, address); call lines (inclusive costs) are skipped."""
    c = collections.Counter()
    ob, after_calls = None, False
    with open(path) as f:
        for line in f:
            if line.startswith("ob="):
                ob = line[3:].strip()
            elif line.startswith("calls="):
                after_calls = True
            elif line.startswith("0x"):
                if after_calls:
                    after_calls = False
                    continue
                p = line.split()
                if len(p) >= 3:
                    c[(ob, int(p[0], 16))] += int(p[2])
    return c


def locked_addresses(obj):
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", obj], capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        m = re.match(r"^\s+([0-9a-f]+):\s+(.*)$", line)
        if m and LOCKED.match(m.group(2)):
            found[int(m.group(1), 16)] = m.group(2).split()[0] + " " + (m.group(2).split()[1] if len(m.group(2).split()) > 1 else "")
    return found


def site(obj, addr):
    out = subprocess.run(["addr2line", "-i", "-f", "-C", "-e", obj, hex(addr)], capture_output=True, text=True).stdout.split("\n")
    frames = [out[i + 1] for i in range(0, len(out) - 1, 2)]
    own = [os.path.basename(f) for f in frames if "/rustc/" not in f and "??" not in f]
    return " < ".join(own[:3]) or "?"


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    if len(sys.argv) < 5 or "--" not in sys.argv:
        sys.exit(__doc__)
    n_a, n_b = int(sys.argv[1]), int(sys.argv[2])
    cmd = sys.argv[sys.argv.index("--") + 1:]
    if n_b <= n_a or not any("{n}" in a for a in cmd):
        sys.exit("locked_ops.py: need N_A < N_B and {n} in the command")
    with tempfile.TemporaryDirectory() as d:
        run(cmd, n_a, f"{d}/a")
        run(cmd, n_b, f"{d}/b")
        a, b = costs(f"{d}/a"), costs(f"{d}/b")
    ops = n_b - n_a
    total = (sum(b.values()) - sum(a.values())) / ops
    rows, locked = [], 0.0
    for obj in sorted({o for o, _ in b if o}):
        if not os.path.exists(obj):
            continue
        for addr, ins in locked_addresses(obj).items():
            per_op = (b.get((obj, addr), 0) - a.get((obj, addr), 0)) / ops
            if per_op > 0.005:
                locked += per_op
                rows.append((per_op, os.path.basename(obj), ins, site(obj, addr)))
    print(f"{' '.join(cmd)}: per operation ({n_a} and {n_b} runs)")
    print(f"  instructions {total:9.1f}")
    print(f"  locked       {locked:9.2f}")
    for per_op, obj, ins, where in sorted(rows, reverse=True):
        print(f"    {per_op:5.2f}  {obj:18} {ins:24} {where}")


if __name__ == "__main__":
    main()
