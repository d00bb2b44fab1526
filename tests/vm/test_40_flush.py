# SPDX-License-Identifier: GPL-2.0
"""Writeback correctness: the origin receives exactly the dirty data, clean
blocks are never written, origin-adjacent blocks merge, holes are bridged,
completion raises a dm event; flush_on_suspend, watermarks.

The oracle is the slow origin's /sys/block stat (dm-delay counts one write
per bio and does not count empty flushes; see test_00_harness)."""

import math
import random
import time

import pytest

import tclib
from tclib import MiB, stat_delta

pytestmark = [pytest.mark.module, pytest.mark.usefixtures("tc_module")]

B = 4096


def runs_of(blocks):
    """Maximal runs of consecutive block numbers, as lengths."""
    runs, prev = [], None
    for b in sorted(blocks):
        if prev is not None and b == prev + 1:
            runs[-1] += 1
        else:
            runs.append(1)
        prev = b
    return runs


def write_blocks(wl, blocks, block_bytes=B):
    for b in blocks:
        wl.write_direct(b * block_bytes, block_bytes)


def check_derived(st):
    if st["wb_requests"]:
        avg = st["wb_sectors"] / 2 / st["wb_requests"]
        assert abs(st["avg_write_kb"] - avg) < 1, f"avg_write_kb vs {avg}: {st['raw']}"
        ratio = st["wb_blocks"] / st["wb_requests"]
        assert abs(st["merge_ratio"] - ratio) <= 0.011, f"merge_ratio vs {ratio}: {st['raw']}"
    else:
        assert st["avg_write_kb"] == 0 and st["merge_ratio"] == 0.0, st["raw"]


def test_flush_writes_exactly_the_dirty_data(stack):
    s = stack.setup(origin_mib=64, cache_mib=16, write_ms=2, seed=31)
    tc, m = s.tc, s.model
    rng = random.Random(32)
    margin = tclib.SCAN_MARGIN // B
    blocks = rng.sample(range(margin, 64 * MiB // B - margin), 400)
    o0 = s.origin.stat()
    with tclib.Workload(tc.path, m, seed=33) as wl:
        write_blocks(wl, rng.sample(blocks, len(blocks)))
    st = tc.status()
    assert st["dirty"] == 400 and st["write_misses"] == 400, st["raw"]
    assert stat_delta(s.origin.stat(), o0)["writes"] == 0, \
        "writeback-mode block writes reached the origin before any flush"
    o1 = s.origin.stat()
    ev = tc.event_nr()
    tc.message("flush")
    tc.wait_event(ev)
    st = tc.wait_idle()
    print(st["raw"])
    d = stat_delta(s.origin.stat(), o1)
    assert st["dirty"] == 0 and st["error"] == 0 and st["flushes"] == 1, st["raw"]
    assert d["write_sectors"] == 400 * 8, \
        f"origin got {d['write_sectors']} sectors for 400 dirty 4 KiB blocks ({d})"
    assert st["wb_blocks"] == 400 and st["wb_sectors"] == 400 * 8, st["raw"]
    assert st["bridged_blocks"] == 0, st["raw"]
    assert d["writes"] == st["wb_requests"], f"origin writes {d['writes']} != wb_requests: {st['raw']}"
    runs = runs_of(blocks)
    assert len(runs) <= st["wb_requests"] <= len(runs) + 1, \
        f"{len(runs)} origin-adjacent runs but {st['wb_requests']} requests: {st['raw']}"
    assert 1 <= st["inflight_max"] <= 128, st["raw"]
    check_derived(st)
    m.verify_device(tc.path)
    # nothing dirty: a second flush writes nothing and still completes
    o2 = s.origin.stat()
    st = tc.flush()
    assert st["flushes"] == 2 and stat_delta(s.origin.stat(), o2)["write_sectors"] == 0, st["raw"]
    tc.remove()
    m.verify_device(s.origin.path, what="origin after flush and remove")


@pytest.mark.parametrize("mode", ["writeback", "writethrough"])
def test_clean_blocks_never_written(stack, mode):
    s = stack.setup(origin_mib=32, cache_mib=16, mode=mode, seed=41)
    tc, m = s.tc, s.model
    with tclib.Workload(tc.path, m, seed=42) as wl:
        for off in range(0, 8 * MiB, 64 * 1024):
            wl.read_check(off, 64 * 1024, direct=True)
        if mode == "writethrough":
            for off in range(8 * MiB, 9 * MiB, B):
                wl.write_direct(off, B)
    deadline = time.monotonic() + 20
    while tc.status()["used"] < 2048 and time.monotonic() < deadline:
        time.sleep(0.1)
    m.verify_device(tc.path, end=9 * MiB)   # hits now
    st0 = tc.status()
    assert st0["used"] >= 2048, f"whole-block read misses not promoted: {st0['raw']}"
    assert st0["read_hits"] > 0 and st0["dirty"] == 0, st0["raw"]
    o0 = s.origin.stat()
    st = tc.flush()
    d = stat_delta(s.origin.stat(), o0)
    assert d["writes"] == 0 and d["write_sectors"] == 0, \
        f"flush of a cache with only clean blocks wrote to the origin: {d}; {st['raw']}"
    assert st["wb_blocks"] == 0 and st["wb_requests"] == 0, st["raw"]
    tc.remove()
    m.verify_device(s.origin.path)


def test_contiguous_flush_merges_fully(stack):
    """8 MiB of 4 KiB blocks written in random order, contiguous on the
    origin: ceil(8 MiB / max_flush_kb) writes, all in flight at once."""
    s = stack.setup(origin_mib=64, cache_mib=32, write_ms=300, seed=51,
                    keys={"max_flush_kb": 1024})
    tc, m = s.tc, s.model
    blocks = list(range(256, 256 + 2048))
    random.Random(52).shuffle(blocks)
    with tclib.Workload(tc.path, m, seed=53) as wl:
        write_blocks(wl, blocks)
    assert tc.status()["dirty"] == 2048
    o0 = s.origin.stat()
    t0 = time.monotonic()
    st = tc.flush()
    dt = time.monotonic() - t0
    d = stat_delta(s.origin.stat(), o0)
    print(f"flush {dt:.2f}s, origin {d['writes']} writes {d['write_sectors']} sectors; {st['raw']}")
    want = math.ceil(8 * 1024 / 1024)
    assert d["write_sectors"] == 2048 * 8, d
    assert d["writes"] == want and st["wb_requests"] == want, \
        f"contiguous 8 MiB flushed as {d['writes']} origin writes (want {want}): {st['raw']}"
    assert st["avg_write_kb"] == 1024 and st["merge_ratio"] == 256.0, st["raw"]
    assert st["inflight_max"] == want, \
        f"{want} requests not all in flight at once (inflight_max {st['inflight_max']})"
    check_derived(st)
    tc.remove()
    m.verify_device(s.origin.path)


@pytest.mark.parametrize("gap_kb", [0, 8])
def test_bridge_gap(stack, gap_kb):
    """Every other block dirty over 1 MiB, plus two runs 12 KiB apart.
    bridge_gap_kb 8 bridges the 4 KiB holes (with their current data: some
    cached clean, some read from the origin) but not the 12 KiB one."""
    s = stack.setup(origin_mib=32, cache_mib=16, write_ms=2, seed=61,
                    keys={"bridge_gap_kb": gap_kb, "max_flush_kb": 1024})
    tc, m = s.tc, s.model
    base = 1024                      # block 1024 = 4 MiB
    dirty = [base + 2 * i for i in range(128)]          # 128 dirty, 127 holes
    far = [4096 + i for i in range(4)] + [4096 + 7 + i for i in range(4)]  # 3-block hole
    with tclib.Workload(tc.path, m, seed=62) as wl:
        # half the holes become clean cached copies first
        for h in range(base + 1, base + 255, 4):
            wl.read_check(h * B, B, direct=True)
        write_blocks(wl, dirty + far)
    st0 = tc.status()
    assert st0["dirty"] == 136, st0["raw"]
    o0 = s.origin.stat()
    st = tc.flush()
    d = stat_delta(s.origin.stat(), o0)
    print(d, st["raw"])
    if gap_kb:
        assert st["bridged_blocks"] == 127, st["raw"]
        assert st["wb_requests"] == 3 and d["writes"] == 3, \
            f"bridged flush: want 3 origin writes, got {d['writes']}: {st['raw']}"
        assert d["write_sectors"] == (255 + 8) * 8, d
    else:
        assert st["bridged_blocks"] == 0, st["raw"]
        assert st["wb_requests"] == 128 + 2 and d["writes"] == 130, st["raw"]
        assert d["write_sectors"] == 136 * 8, d
    assert st["wb_blocks"] == 136, st["raw"]
    assert st["wb_sectors"] == d["write_sectors"], st["raw"]
    check_derived(st)
    m.verify_device(tc.path)
    tc.remove()
    m.verify_device(s.origin.path, what="origin after a bridged flush")


def test_rewrite_during_flush_stays_dirty(stack):
    """Blocks rewritten while their writeback is in flight keep the new data."""
    s = stack.setup(origin_mib=32, cache_mib=16, write_ms=500, seed=71)
    tc, m = s.tc, s.model
    blocks = list(range(100, 164))
    with tclib.Workload(tc.path, m, seed=72) as wl:
        write_blocks(wl, blocks)
        ev = tc.event_nr()
        tc.message("flush")
        time.sleep(0.05)
        write_blocks(wl, blocks[::4])       # 16 rewrites while in flight
        tc.wait_event(ev)
        st = tc.wait_idle(want_clean=False)
        print(st["raw"])
        assert st["error"] == 0 and st["dirty"] <= 16, st["raw"]
        m.verify_device(tc.path, end=1 * MiB, what="read back after rewrites during flush")
    tc.flush()
    tc.remove()
    m.verify_device(s.origin.path, what="origin: rewrites during a flush must not be lost")


@pytest.mark.parametrize("fos", [0, 1])
def test_flush_on_suspend(stack, fos):
    s = stack.setup(origin_mib=32, cache_mib=16, write_ms=2, seed=81,
                    keys={"flush_on_suspend": fos})
    tc, m = s.tc, s.model
    with tclib.Workload(tc.path, m, seed=82) as wl:
        write_blocks(wl, range(0, 300, 3))
    assert tc.status()["dirty"] == 100
    tc.suspend()
    try:
        st = tc.status()
        if fos:
            assert st["dirty"] == 0, f"flush_on_suspend 1: dirty after suspend: {st['raw']}"
            m.verify_device(s.origin.path, end=2 * MiB, what="origin after suspend")
        else:
            assert st["dirty"] == 100, f"flush_on_suspend 0 changed dirty: {st['raw']}"
    finally:
        tc.resume()
    tc.flush()
    tc.remove()
    m.verify_device(s.origin.path)


def test_background_writeback_watermarks(stack):
    """Dirty share above high_watermark starts writeback; it stops below
    low_watermark without a flush message.

    The blocks are written with high_watermark 100 (no writeback), then
    one more after it is set to 20: writeback that caught up with the
    writer would stop below low_watermark while the writer still wrote
    (then idle above it, as documented), which a slow writer made a
    flaky failure."""
    s = stack.setup(origin_mib=32, cache_mib=4, write_ms=5, seed=91,
                    keys={"high_watermark": 100, "low_watermark": 10})
    tc, m = s.tc, s.model
    total = tc.status()["total"]
    n = total * 30 // 100
    blocks = random.Random(92).sample(range(32 * MiB // B), n + 1)
    with tclib.Workload(tc.path, m, seed=93) as wl:
        write_blocks(wl, blocks[:n])
        st = tc.status()
        assert st["dirty"] == n and st["flush_state"] == "idle" and \
            st["wb_blocks"] == 0, st["raw"]
        tc.message("set", "high_watermark", "20")
        write_blocks(wl, blocks[n:])
    deadline = time.monotonic() + 60
    st = tc.status()
    while time.monotonic() < deadline:
        st = tc.status()
        if st["dirty"] * 100 < total * 10 and st["flush_state"] == "idle":
            break
        time.sleep(0.2)
    print(st["raw"])
    assert st["dirty"] * 100 < total * 10, \
        f"{n}/{total} dirty (30%) with high_watermark 20: still {st['dirty']} dirty: {st['raw']}"
    assert st["flush_state"] == "idle" and st["wb_blocks"] > 0 and st["flushes"] == 0, st["raw"]
    m.verify_device(tc.path)
    tc.flush()
    tc.remove()
    m.verify_device(s.origin.path)
