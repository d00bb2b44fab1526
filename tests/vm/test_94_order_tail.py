# SPDX-License-Identifier: GPL-2.0
"""The dirty order's tail full: writes wait for its merge (issue 11).

Writers put every slot they make dirty into the dirty order's tail (a
fixed buffer: a cache of fewer than 2^18 slots has 1024 entries), and the
writeback engine merges it into the sorted walk.  When writers fill it
before the engine gets a CPU, a write that would make a block dirty used
to give up on the cache: a miss went around it, a hit on a clean copy went
to both devices, each a small random write on the slow disk, which is
what the cache is there to avoid (2026-11-29: 512 of 65,536 warm-up writes
of scripts/hotpath.sh on a loaded machine).  Such a write now waits for
the merge it kicked.

The engine is held off deterministically: every unbound workqueue (the
engine's included) is confined to CPU 1, where a SCHED_FIFO task spins for
a few seconds with RT throttling off (and, from 6.12, the fair server of
CPU 1 off too), while this test writes from CPU 0.
The RAM disks complete each write in the writer's own context, so nothing
else is needed for a write that stays in the cache.

  1  1536 write misses of distinct blocks: all dirty in the cache, none
     around it, no write on the origin; the writer was held until the
     engine could run; the data reads back, and after a flush the origin
     holds it byte for byte
  2  the same 1536 blocks, now clean in the cache, rewritten: all dirty
     again, no write on the origin
"""

import os
import random
import subprocess
import time

import pytest

import tclib
from tclib import MiB

pytestmark = [pytest.mark.module, pytest.mark.usefixtures("tc_module")]

B = 4096
TAIL = 1024                 # tc_dorder_tail_cap() below 2^18 slots
N = TAIL + TAIL // 2
STRIDE = 3                  # blocks apart: no two writes of one request
SPIN_S = 4.0
WQ_MASK = "/sys/devices/virtual/workqueue/cpumask"
RT_RUNTIME = "/proc/sys/kernel/sched_rt_runtime_us"
# 6.12+: a deadline server gives fair tasks 5 % of a CPU under real-time load
FAIR_SERVER = "/sys/kernel/debug/sched/fair_server/cpu1/runtime"
KEYS = {"high_watermark": 80, "low_watermark": 10}

SPINNER = r"""
import os, sys, time
os.sched_setaffinity(0, {1})
os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(50))
print("spinning", flush=True)
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    pass
"""


def read_text(path):
    with open(path) as f:
        return f.read().strip()


def write_text(path, text):
    with open(path, "w") as f:
        f.write(text)


class EngineHeld:
    """Unbound workqueues on CPU 1, which a real-time task keeps busy for
    SPIN_S seconds; the caller runs on CPU 0 meanwhile."""

    def __enter__(self):
        if len(os.sched_getaffinity(0)) < 2 or not os.path.exists(WQ_MASK):
            pytest.skip("needs two CPUs and the unbound workqueue cpumask")
        if not os.path.ismount("/sys/kernel/debug"):
            tclib.run(["mount", "-t", "debugfs", "none", "/sys/kernel/debug"],
                      check=False)
        self.mask, self.rt = read_text(WQ_MASK), read_text(RT_RUNTIME)
        self.fair = read_text(FAIR_SERVER) if os.path.exists(FAIR_SERVER) else None
        self.cpus = os.sched_getaffinity(0)
        write_text(RT_RUNTIME, "-1")
        if self.fair is not None:
            write_text(FAIR_SERVER, "0")
        write_text(WQ_MASK, "2")
        self.p = subprocess.Popen(["python3", "-c", SPINNER, str(SPIN_S)],
                                  stdout=subprocess.PIPE, text=True)
        os.sched_setaffinity(0, {0})
        line = self.p.stdout.readline().strip()
        self.start = time.monotonic()
        assert line == "spinning", f"spinner: {line!r}"
        return self

    def __exit__(self, *exc):
        try:
            self.p.wait(timeout=SPIN_S + 60)
            self.end = time.monotonic()
        finally:
            # in the reverse order of the changes
            if self.fair is not None:
                write_text(FAIR_SERVER, self.fair)
            write_text(RT_RUNTIME, self.rt)
            write_text(WQ_MASK, self.mask)
            os.sched_setaffinity(0, self.cpus)
        return False


def burst(tc, blocks, datas):
    """Write each block with O_DIRECT from CPU 0 while the engine is held;
    returns (seconds the writes took, seconds the engine was held)."""
    buf = tclib.aligned_buf(B)
    fd = os.open(tc.path, os.O_WRONLY | os.O_DIRECT)
    try:
        with EngineHeld() as held:
            t0 = time.monotonic()
            for b, d in zip(blocks, datas):
                buf[:B] = d
                assert os.pwrite(fd, memoryview(buf)[:B], b * B) == B
            took = time.monotonic() - t0
        return took, held.end - t0
    finally:
        os.close(fd)
        buf.close()


def check_burst(tc, origin, st0, w0, took, held, what):
    st = tc.status()
    d = {k: st[k] - st0[k] for k in ("write_bypass", "write_hits", "write_misses")}
    w = tclib.block_stat(origin.path)["writes"] - w0
    tclib.kmsg(f"{what}: {N} writes in {took:.2f} s, engine held {held:.2f} s; "
              f"{d}, origin writes {w}: {st['raw']}")
    assert d["write_bypass"] == 0, \
        f"{what}: {d['write_bypass']} of {N} writes went around the cache: {st['raw']}"
    assert w == 0, f"{what}: the origin took {w} writes while the cache had room"
    assert st["dirty"] == N, f"{what}: {st['dirty']} dirty of {N} written: {st['raw']}"
    # the premise: the tail filled, and the writer waited for the engine
    assert took >= held - 0.5, \
        f"{what}: the writes took {took:.2f} s, the engine was held " \
        f"{held:.2f} s: the tail never filled (the test proves nothing)"


def verify(path, blocks, datas, what):
    for b, d in zip(blocks, datas):
        got = tclib.read_direct(path, b * B, B)
        if got != d:
            tclib.compare(d, got, b * B, what)


def test_full_tail_waits_for_the_merge(stack):
    s = stack.setup(origin_mib=128, cache_mib=64, keys=KEYS)
    tc, origin = s.tc, s.origin
    assert tc.status()["total"] < 1 << 18
    rng = random.Random(94)
    blocks = rng.sample(range(0, 128 * MiB // B, STRIDE), N)
    datas = [rng.randbytes(B) for _ in blocks]

    st0, w0 = tc.status(), tclib.block_stat(origin.path)["writes"]
    took, held = burst(tc, blocks, datas)
    check_burst(tc, origin, st0, w0, took, held, "misses")
    verify(tc.path, blocks, datas, "through tiercache after the misses")
    tc.flush()
    verify(origin.path, blocks, datas, "origin after the flush")

    # 2: the blocks are clean copies now; rewriting them makes them dirty
    datas = [rng.randbytes(B) for _ in blocks]
    st0, w0 = tc.status(), tclib.block_stat(origin.path)["writes"]
    assert st0["dirty"] == 0 and st0["used"] >= N, st0["raw"]
    took, held = burst(tc, blocks, datas)
    check_burst(tc, origin, st0, w0, took, held, "hits on clean copies")
    verify(tc.path, blocks, datas, "through tiercache after the rewrites")
    tc.flush()
    verify(origin.path, blocks, datas, "origin after the second flush")
