# SPDX-License-Identifier: GPL-2.0
"""A cache of more than 2^25 slots builds, within its memory budget (issue 11).

The cache device and the origin are null_blk devices without backing
memory: any size, nothing kept (data is not verified here; the other
suites do that on small caches).  The kernel memory a cache costs is the
drop of MemAvailable over its create (page cache dropped before each
reading), divided by its slots: at most 16 bytes per 4 KiB slot, all in
(the index, the dirty order's buffers, the metadata bitmaps), before any
block is dirty.  Then dirty blocks spread over the origin are written,
counted, and a full flush writes them to the origin.

The first core (an xarray and a 24-byte entry per slot, and a 32-byte
metadata entry per slot twice over: image and shadow) needed about 64 bytes
per slot at create and could not build this cache in the test VM's 2 GiB.
"""

import random
import time

import tclib
from tclib import KiB, MiB

SLOTS = (1 << 25) + (1 << 21)          # more than 2^25 (128 GiB)
BUDGET = 16.0                           # bytes per slot, issue 11


def mem_available():
    tclib.drop_caches()
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * KiB
    raise AssertionError("no MemAvailable in /proc/meminfo")


def test_cache_of_more_than_2_25_slots(stack):
    # data, plus 32 bytes of metadata per slot and some room
    cache_mib = (SLOTS * 4 * KiB + SLOTS * 32) // MiB + 64
    cache = stack.nullb(cache_mib, blocksize=4096, memory_backed=0)
    origin = stack.nullb(1024 * 1024, blocksize=4096, memory_backed=0)
    before = mem_available()
    t0 = time.monotonic()
    tc = stack.tiercache(origin, cache, 8, "writeback",
                         keys=[("high_watermark", 100)])
    create_s = time.monotonic() - t0
    after = mem_available()
    st = tc.status()
    assert st["total"] > 1 << 25, st["raw"]
    per_slot = (before - after) / st["total"]
    print(f"{st['total']} slots: {per_slot:.2f} B/slot at create, "
          f"create {create_s:.1f} s")
    assert per_slot <= BUDGET, \
        f"{per_slot:.2f} bytes per slot after create (budget {BUDGET})"

    rng = random.Random(96)
    nblocks = tclib.size_bytes(origin) // (4 * KiB)
    blocks = sorted(set(rng.randrange(nblocks) for _ in range(2000)))
    for b in blocks:
        tclib.write_direct(tc.path, b * 4 * KiB, bytes([b % 251]) * 4 * KiB)
    st = tc.status()
    assert st["dirty"] == len(blocks), st["raw"]
    n0 = tclib.block_stat(origin)
    st = tc.flush(timeout=600)
    d = tclib.stat_delta(tclib.block_stat(origin), n0)
    print(f"flushed {len(blocks)} blocks: {d['writes']} origin writes, "
          f"{d['write_sectors']} sectors")
    assert d["write_sectors"] >= len(blocks) * 8, d


def test_cache_too_large_for_memory_is_refused(stack):
    """A cache whose state cannot fit in memory is refused with ENOMEM and
    the figures in the kernel log, up front: no allocation that wakes the
    OOM killer, no device left behind."""
    # 2^32 - 1 slots' worth: about 48 GiB of state, the VM has 2 GiB
    cache = stack.nullb(16 * 1024 * 1024 + 256 * 1024, blocksize=4096,
                        memory_backed=0)
    origin = stack.nullb(16 * 1024 * 1024, blocksize=4096, memory_backed=0)
    tclib.ensure_module()
    table = tclib.TierCache.make_table(origin, cache, 8, "writeback")
    cur = tclib.KmsgCursor("too-large")
    p = tclib.run(["dmsetup", "create", "tc-huge", "--table", table],
                  check=False, timeout=300)
    lines = cur.lines()
    if p.returncode == 0:
        tclib.run(["dmsetup", "remove", "tc-huge"], check=False)
    assert p.returncode != 0, "a cache of 2^32 - 1 slots was built in 2 GiB"
    assert "Cannot allocate memory" in p.stderr, p.stderr
    assert any("Not enough memory for a cache" in ln for ln in lines), \
        lines[-10:]
    assert any("MiB of kernel memory" in ln for ln in lines), lines[-10:]
    assert not any("oom-killer" in ln or "Out of memory" in ln
                   for ln in lines), "\n".join(lines[-20:])
    assert "tc-huge" not in tclib.dm_names()
